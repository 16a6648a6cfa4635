"""Requests, leases and the decisions the scheduler returns about them.

The scheduler never resolves anything itself: each of its methods changes state and returns the
decisions it took — :class:`Dispatch` (a request got a slot, here is its :class:`SlotLease`) or
:class:`Rejection` (a request was refused or dropped, with its reason) — for the shell to act on.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import TYPE_CHECKING

from iop_edge.pool.policy import ProviderKey

if TYPE_CHECKING:
    from iop_edge.pool.fair import Share
    from iop_edge.pool.slots import ProviderSlot


class RequestState(Enum):
    """Where a submitted request stands. ``PENDING`` is the only state that can still change."""

    PENDING = "pending"
    DISPATCHED = "dispatched"
    REJECTED = "rejected"


class RejectReason(StrEnum):
    """Why a request was refused or dropped; the values are the API error codes."""

    QUEUE_FULL = "queue_full"
    PRINCIPAL_QUEUE_FULL = "principal_queue_full"
    RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"
    QUEUE_TIMEOUT = "queue_timeout"
    NO_AVAILABLE_PROVIDER = "no_available_provider"
    MODEL_NOT_FOUND = "model_not_found"
    CLIENT_GONE = "client_gone"
    HANDED_OVER = "handed_over"
    STORE_UNAVAILABLE = "store_unavailable"


class PendingRequest:
    """One request submitted to the scheduler, and its handle for :meth:`cancel`.

    Callers read the attributes and never write them; only the scheduler moves ``state`` from
    ``PENDING`` to ``DISPATCHED`` (then ``lease`` is set, until
    the lease is released) or ``REJECTED`` (then ``rejection`` is
    set), exactly once — or, failing over, from ``DISPATCHED`` back to ``PENDING``:
    ``attempts`` counts the providers it was given, ``tried`` names them. ``deadline`` is the
    monotonic time at which a pending request expires (``None``: never); it is recomputed from
    ``submitted_at`` when the queue timeout changes. ``share`` is the
    :class:`~iop_edge.pool.fair.Share` of the principal it is served for (``principal`` its name)
    and ``start`` its start tag in the fair order (see :mod:`iop_edge.pool.fair`). Identity is
    the request: two handles are equal only if they are the same object.
    """

    __slots__ = (
        "attempts",
        "deadline",
        "group_id",
        "lease",
        "long_context",
        "queue",
        "rejection",
        "request_id",
        "share",
        "start",
        "state",
        "submitted_at",
        "tried",
    )

    def __init__(
        self, request_id: int, group_id: str, long_context: bool, submitted_at: float
    ) -> None:
        self.request_id = request_id
        self.group_id = group_id
        self.long_context = long_context
        self.submitted_at = submitted_at
        self.deadline: float | None = None
        self.state = RequestState.PENDING
        self.lease: SlotLease | None = None
        self.rejection: Rejection | None = None
        self.queue: RequestQueue | None = None
        #: set at once by the scheduler's submit (or a FairQueue's push): never None after
        self.share: Share = None  # type: ignore[assignment]
        self.start = 0.0
        self.attempts = 0
        self.tried: frozenset[ProviderKey] = frozenset()

    @property
    def principal(self) -> str:
        """Who the request is served for (its share's name; ``""`` before it has one)."""
        share: Share | None = self.share
        return "" if share is None else share.name

    def __repr__(self) -> str:
        kind = "long" if self.long_context else "general"
        # The attempt it holds, or (pending or refused) the one it waits for.
        attempt = self.attempts + (self.state is not RequestState.DISPATCHED)
        retry = f" attempt {attempt}" if attempt > 1 else ""
        return (
            f"PendingRequest(#{self.request_id} {self.group_id!r} {kind}{retry} "
            f"{self.state.value} deadline={self.deadline})"
        )


class SlotLease:
    """A slot held on one provider by one admitted request, until released exactly once.

    Release it with :meth:`iop_edge.pool.PoolScheduler.release`; a second release is a counted
    no-op. The lease keeps its provider's slot record, so it is released correctly even after a
    policy swap removed the provider. ``granted_at`` minus ``request.submitted_at`` is the time
    the request waited in the queue.
    """

    __slots__ = ("granted_at", "long_context", "owner", "released", "request", "slot")

    def __init__(
        self,
        owner: object,
        request: PendingRequest,
        slot: ProviderSlot,
        granted_at: float,
    ) -> None:
        self.owner = owner
        self.request = request
        self.slot = slot
        self.long_context = request.long_context
        self.granted_at = granted_at
        self.released = False

    @property
    def node_id(self) -> str:
        """The node of the provider holding the slot."""
        return self.slot.key[0]

    @property
    def provider_id(self) -> str:
        """The provider holding the slot."""
        return self.slot.key[1]

    @property
    def key(self) -> ProviderKey:
        """The provider resource ``(node_id, provider_id)`` holding the slot."""
        return self.slot.key

    def __repr__(self) -> str:
        kind = "long" if self.long_context else "general"
        state = "released" if self.released else "held"
        return f"SlotLease(#{self.request.request_id} on {'/'.join(self.key)} {kind} {state})"


@dataclass(frozen=True, slots=True, eq=False)
class Dispatch:
    """Decision: ``request`` was admitted onto a provider slot, held by ``lease``."""

    request: PendingRequest
    lease: SlotLease


@dataclass(frozen=True, slots=True, eq=False)
class Rejection:
    """Decision: ``request`` was refused at submit or dropped from the queue.

    ``config_change`` is true when a live policy swap caused it (its group was removed or lost
    its last enabled provider). ``message`` is a full sentence for the client.
    """

    request: PendingRequest
    reason: RejectReason
    message: str
    config_change: bool = False
    retry_after: float | None = None


Decision = Dispatch | Rejection
"""One thing the scheduler decided about one request."""


@dataclass(frozen=True, slots=True, eq=False)
class Failover:
    """What :meth:`iop_edge.pool.PoolScheduler.fail` did with a failed attempt's request.

    ``retried``: it re-entered admission (ahead of the queue, excluding the providers it
    tried); its state then says whether it got a slot, waits, or was refused. Not retried: no
    attempt left or no untried candidate — the caller returns the failed attempt's error.
    ``decisions`` lists everything decided during the call, in order.
    """

    request: PendingRequest
    retried: bool
    decisions: list[Decision]


@dataclass(frozen=True, slots=True, eq=False)
class Submission:
    """What :meth:`iop_edge.pool.PoolScheduler.submit` did.

    ``request`` is the new request: dispatched, rejected, or still pending (queued).
    ``decisions`` lists everything decided during the call in order — expirations that came due
    first, then the new request's own :class:`Dispatch` or :class:`Rejection` if it got one.
    """

    request: PendingRequest
    decisions: list[Decision]


class RequestQueue:
    """The FIFO of pending requests of one (model group, kind), with lazy removal.

    A request that leaves from the middle (cancel, expiry) stays in the deque until it reaches
    the head or the deque is compacted, so every operation is O(1) amortized.
    """

    __slots__ = ("entries", "live")

    def __init__(self) -> None:
        self.entries: deque[PendingRequest] = deque()
        self.live = 0

    def push(self, request: PendingRequest) -> None:
        """Append ``request`` (the newest) and point it at this queue."""
        request.queue = self
        self.entries.append(request)
        self.live += 1

    def head(self) -> PendingRequest | None:
        """Return the oldest request still pending here, dropping departed ones on the way."""
        entries = self.entries
        while entries:
            request = entries[0]
            if request.queue is self:
                return request
            entries.popleft()
        return None

    def discard(self, request: PendingRequest) -> None:
        """Take ``request`` out of the queue (lazily), whatever its position."""
        request.queue = None
        self.live -= 1
        entries = self.entries
        if entries and entries[0] is request:
            entries.popleft()
        elif len(entries) > 2 * self.live + 64:
            # Many departures from the middle: compact so memory follows the live count.
            self.entries = deque(r for r in entries if r.queue is self)

    def __iter__(self) -> Iterator[PendingRequest]:
        """Iterate over the requests still pending here, oldest first."""
        return (r for r in list(self.entries) if r.queue is self)

    def __len__(self) -> int:
        return self.live
