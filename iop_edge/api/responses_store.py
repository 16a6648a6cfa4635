"""The stored responses of ``/v1/responses`` (issue 28): a bounded in-memory store.

A response created without ``store: false`` is kept here so that ``previous_response_id`` can
continue it, and ``GET`` / ``DELETE /v1/responses/{id}`` answer. Each entry holds the Response
object's JSON exactly as the client got it, and the conversation up to and including that
response (its input items and its output items: what a request continuing it sends upstream
before its own input).

Bounds (``openai.responses_store``, live: :meth:`ResponsesStore.reconfigure`):

- ``max_items`` entries and ``max_bytes`` bytes, an entry's size being the length of its
  response JSON plus that of its items' compact JSON. The least recently used entries (a
  :meth:`~ResponsesStore.get` counts as a use) go first until both bounds hold; an entry larger
  than ``max_bytes`` on its own is not stored at all (counted as ``too_large``).
- ``ttl`` seconds from the moment an entry was stored (a use does not extend it). There is no
  timer: an expired entry is dropped when it is asked for and swept, oldest first, on every
  :meth:`~ResponsesStore.put` and :meth:`~ResponsesStore.reconfigure`. Until then it still
  counts in :meth:`~ResponsesStore.statistics` — it still holds its memory.

Items are kept as their JSON (bytes), not as Python objects: the memory an entry holds is then
close to its counted size (a parsed JSON tree takes several times its text), and neither the
caller of ``put`` nor that of ``get`` can change what another ``get`` will see. Both byte
strings are right-sized copies (:func:`_trimmed`: orjson's own output holds up to eight times
its length).

An entry belongs to the owner (the principal) that stored it. For anyone else it does not
exist: :meth:`~ResponsesStore.get` answers ``None`` for an unknown, an expired and a foreign id
alike, so the 404 the caller sends cannot tell which.

**Nothing survives the process.** The store lives in this process's memory only: a restart,
and a handover to a new process (``iop-edge restart``), start it empty, and a request naming a
``previous_response_id`` stored before gets the same 404 as an unknown id, which says so.

One event loop owns the store: no locks, no timers; every operation is O(1) but for the bytes
of the entry it touches (JSON encoding on ``put``, decoding on ``get``) and the expired
entries it sweeps, each swept once.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from iop_edge.seams import Clock

__all__ = ["ResponsesStore", "ResponsesStoreStatistics", "StoredResponse"]


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """One stored response, as :meth:`ResponsesStore.get` returns it.

    ``response`` is the Response object's JSON as the client got it; ``items`` the conversation
    up to and including it (input items, then output items), decoded afresh for this caller;
    ``created`` the store's clock time when it was stored (monotonic seconds, not wall time).
    """

    response_id: str
    owner: str
    response: bytes
    items: tuple[dict[str, Any], ...]
    created: float


@dataclass(frozen=True, slots=True)
class ResponsesStoreStatistics:
    """The store as of now: what it holds, its bounds, and what it has stored and dropped.

    ``items`` / ``bytes``: entries held and their counted size (expired ones not yet swept
    included). ``stored``: entries taken since the start; ``evicted``: dropped as least recently
    used to keep the bounds; ``expired``: dropped at the end of their ``ttl``; ``too_large``:
    refused for being larger than ``max_bytes`` on their own.
    """

    items: int
    bytes: int
    max_items: int
    max_bytes: int
    ttl: float
    stored: int
    evicted: int
    expired: int
    too_large: int


class _Entry:
    """What the store keeps of a response (its items as compact JSON)."""

    __slots__ = ("created", "items_json", "owner", "response", "size")

    def __init__(self, owner: str, response: bytes, items_json: bytes, created: float) -> None:
        self.owner = owner
        self.response = response
        self.items_json = items_json
        self.created = created
        self.size = len(response) + len(items_json)


def _plain(value: object) -> object:
    # orjson encodes dicts, lists and tuples itself; any other mapping or sequence (a read-only
    # view) is turned into one of those.
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return list(value)
    raise TypeError(f"a {type(value).__name__} is not JSON; stored items must be JSON values")


def _trimmed(data: bytes) -> bytes:
    """A copy of ``data`` that holds exactly its length.

    orjson (3.12 on) returns its output in the buffer it grew, rounded up to a power of two
    and never shrunk: a 2 KiB response's JSON holds 16 KiB, eight times what the store counts
    (bench/bench_responses_store.py measured it). A short-lived body does not care; a stored
    one would hold the difference for its whole life, so the store keeps a right-sized copy of
    whatever it is given (a fraction of a µs for 2 KiB).
    """
    return bytes(memoryview(data))


class ResponsesStore:
    """Responses by id, bounded by count, bytes and age; least recently used out first.

    ``ttl`` is in seconds, on ``clock`` (``openai.responses_store.ttl_ms / 1000``).
    """

    def __init__(self, *, max_items: int, max_bytes: int, ttl: float, clock: Clock) -> None:
        self._clock = clock
        self._max_items = max_items
        self._max_bytes = max_bytes
        self._ttl = ttl
        # Two orders over the same entries: by use (the LRU end first) and by age (the first to
        # expire first). The ttl is the same for every entry, so storing order is expiry order.
        self._by_use: OrderedDict[str, _Entry] = OrderedDict()
        self._by_age: OrderedDict[str, _Entry] = OrderedDict()
        self._bytes = 0
        self._stored = 0
        self._evicted = 0
        self._expired = 0
        self._too_large = 0

    def put(
        self,
        response_id: str,
        owner: str,
        response: bytes,
        items: Sequence[Mapping[str, Any]],
    ) -> None:
        """Store ``response`` (its JSON as the client got it) and the conversation ``items``
        up to and including it, for ``owner``; an entry of the same id is replaced.

        Expired entries are swept first; then least recently used ones are evicted until both
        bounds hold. An entry larger than ``max_bytes`` is not stored (and counted).
        """
        now = self._clock.now()
        self._drop(response_id)
        self._sweep(now)
        entry = _Entry(
            owner, _trimmed(response), _trimmed(orjson.dumps(items, default=_plain)), now
        )
        if entry.size > self._max_bytes:
            self._too_large += 1
            return
        self._by_use[response_id] = entry
        self._by_age[response_id] = entry
        self._bytes += entry.size
        self._stored += 1
        self._shrink()

    def get(self, response_id: str, owner: str) -> StoredResponse | None:
        """The response ``response_id`` of ``owner``, which counts as a use of it.

        ``None`` when it is unknown, expired, or another owner's: the caller answers all three
        alike (404), so a client learns nothing about ids it does not own.
        """
        entry = self._live(response_id)
        if entry is None or entry.owner != owner:
            return None
        self._by_use.move_to_end(response_id)
        return StoredResponse(
            response_id=response_id,
            owner=owner,
            response=entry.response,
            items=tuple(orjson.loads(entry.items_json)),
            created=entry.created,
        )

    def delete(self, response_id: str, owner: str) -> bool:
        """Forget the response ``response_id`` of ``owner``; ``False`` when there was none to
        forget (unknown, expired, or another owner's, which is left alone)."""
        entry = self._live(response_id)
        if entry is None or entry.owner != owner:
            return False
        self._drop(response_id)
        return True

    def reconfigure(self, *, max_items: int, max_bytes: int, ttl: float) -> None:
        """Take new bounds (a live config change); a store over them shrinks at once: expired
        entries first (a shorter ``ttl`` applies to the entries held), then any entry larger
        than a lower ``max_bytes`` on its own, then the least recently used (both evictions).

        The one operation that may look at every entry (when ``max_bytes`` goes down).
        """
        lower = max_bytes < self._max_bytes
        self._max_items = max_items
        self._max_bytes = max_bytes
        self._ttl = ttl
        self._sweep(self._clock.now())
        if lower:
            # Else the LRU order would evict every entry used before it, then it anyway.
            for response_id in [k for k, e in self._by_use.items() if e.size > max_bytes]:
                self._drop(response_id)
                self._evicted += 1
        self._shrink()

    def statistics(self) -> ResponsesStoreStatistics:
        """The store as of now (read-only: nothing is swept)."""
        return ResponsesStoreStatistics(
            items=len(self._by_use),
            bytes=self._bytes,
            max_items=self._max_items,
            max_bytes=self._max_bytes,
            ttl=self._ttl,
            stored=self._stored,
            evicted=self._evicted,
            expired=self._expired,
            too_large=self._too_large,
        )

    def __len__(self) -> int:
        """Entries held (expired ones not yet swept included)."""
        return len(self._by_use)

    def __repr__(self) -> str:
        return (
            f"<ResponsesStore {len(self._by_use)}/{self._max_items} items, "
            f"{self._bytes}/{self._max_bytes} bytes, ttl {self._ttl:g} s>"
        )

    # -- internals ---------------------------------------------------------------------------

    def _live(self, response_id: str) -> _Entry | None:
        """The entry of ``response_id`` unless it is missing or expired (then dropped)."""
        entry = self._by_use.get(response_id)
        if entry is None:
            return None
        if self._clock.now() >= entry.created + self._ttl:
            self._drop(response_id)
            self._expired += 1
            return None
        return entry

    def _sweep(self, now: float) -> None:
        """Drop the expired entries, oldest first; stops at the first one still live."""
        by_age = self._by_age
        while by_age:
            response_id, entry = next(iter(by_age.items()))
            if now < entry.created + self._ttl:  # the same test as _live's, to the last bit
                return
            self._drop(response_id)
            self._expired += 1

    def _shrink(self) -> None:
        """Evict the least recently used entries until both bounds hold."""
        by_use = self._by_use
        while by_use and (len(by_use) > self._max_items or self._bytes > self._max_bytes):
            response_id, entry = by_use.popitem(last=False)
            del self._by_age[response_id]
            self._bytes -= entry.size
            self._evicted += 1

    def _drop(self, response_id: str) -> None:
        entry = self._by_use.pop(response_id, None)
        if entry is not None:
            del self._by_age[response_id]
            self._bytes -= entry.size
