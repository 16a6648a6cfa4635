"""The node's adapters, one :class:`~iop_edge.adapters.registry.AdapterSet` per payload
generation (design §6, "Handover and restarts").

A link acknowledges one payload generation (``PAYLOAD.generation``, a hash of the payload's
content). During an ``iop-edge restart`` the node dials the new edge process while its old link
still finishes requests: an equal generation then reuses the adapters already built (their HTTP
pools and CLI trackers stay as they are), a new one builds a second set beside the first, and
each set is closed once its last user — a link, or a request still running on it — has released
it. Building a set does no I/O (:meth:`AdapterSet.from_payload`), so :meth:`PayloadCache.acquire`
is synchronous and two acquires cannot race.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from iop_edge.adapters.registry import AdapterSet
from iop_edge.config.payload import NodeConfigPayload
from iop_edge.seams import Clock

__all__ = ["PayloadCache", "UnknownGeneration"]


class UnknownGeneration(LookupError):
    """The edge named a generation without its payload, and this node holds no set for it."""


@dataclass
class _Held:
    adapters: AdapterSet
    users: int


class PayloadCache:
    """Reference-counted :class:`AdapterSet` per payload generation.

    ``build`` makes a set from a payload (:meth:`AdapterSet.from_payload` on ``clock`` by
    default; tests hand in their own). Every :meth:`acquire` is paired with one
    :meth:`release` of the same generation.
    """

    def __init__(
        self,
        clock: Clock | None = None,
        build: Callable[[NodeConfigPayload], AdapterSet] | None = None,
    ) -> None:
        self._build = build or (lambda payload: AdapterSet.from_payload(payload, clock))
        self._held: dict[str, _Held] = {}

    @property
    def generations(self) -> tuple[str, ...]:
        """The generations whose sets are built and held, oldest first (``HELLO.have``)."""
        return tuple(self._held)

    def users(self, generation: str) -> int:
        """How many users hold ``generation``'s set (0 when none is built)."""
        held = self._held.get(generation)
        return held.users if held else 0

    def acquire(self, generation: str, payload: NodeConfigPayload | None) -> AdapterSet:
        """The set of ``generation``: the one already built when there is one (``payload`` is
        then not looked at: the generation is a hash of the content), else a new one built from
        ``payload``. Raises :class:`UnknownGeneration` when there is neither, and whatever
        building raises (a payload this node cannot run) with nothing held."""
        held = self._held.get(generation)
        if held is None:
            if payload is None:
                have = ", ".join(self._held) or "none"
                raise UnknownGeneration(
                    f"the edge sent payload generation {generation!r} without its payload, "
                    f"and this node holds no adapters for it (it holds: {have})"
                )
            held = self._held[generation] = _Held(self._build(payload), 0)
        held.users += 1
        return held.adapters

    async def release(self, generation: str) -> None:
        """One user of ``generation`` is done with its set; the last one closes it (its pooled
        connections, its CLI process groups). A release without an acquire raises
        :class:`ValueError`."""
        held = self._held.get(generation)
        if held is None:
            raise ValueError(
                f"payload generation {generation!r} released more often than it was acquired"
            )
        held.users -= 1
        if held.users == 0:
            del self._held[generation]
            await held.adapters.aclose()

    async def aclose(self) -> None:
        """Close every set still held, users or not (the process exits)."""
        held, self._held = self._held, {}
        for entry in held.values():
            await entry.adapters.aclose()
