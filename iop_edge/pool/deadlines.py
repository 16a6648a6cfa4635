"""The scheduler's timers: the deadlines of pending requests (:class:`DeadlineHeap`) and the
providers' health times (:class:`HealthTimers`), each one heap, soonest first, with lazy removal.

A request that leaves the queue (dispatched, cancelled, dropped) or whose deadline is recomputed
keeps its old entry until it surfaces; the heap is compacted when stale entries outnumber live
ones, so memory follows the queue and every operation stays O(log n) amortized.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from iop_edge.pool.decisions import PendingRequest

if TYPE_CHECKING:
    from iop_edge.pool.slots import ProviderSlot

DeadlineEntry = tuple[float, int, PendingRequest]


def _live(entry: DeadlineEntry) -> bool:
    request = entry[2]
    return request.queue is not None and request.deadline == entry[0]


class DeadlineHeap:
    """When each pending request expires; ties break by request id (the older first)."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[DeadlineEntry] = []

    def push(self, request: PendingRequest, pending: int) -> None:
        """Track ``request.deadline``; ``pending`` (the queue depth) sizes the compaction."""
        assert request.deadline is not None
        heap = self._heap
        heapq.heappush(heap, (request.deadline, request.request_id, request))
        if len(heap) > 2 * pending + 64:
            live = [entry for entry in heap if _live(entry)]
            heapq.heapify(live)
            self._heap = live

    def soonest(self) -> float | None:
        """The earliest deadline of a request still pending, or ``None``."""
        heap = self._heap
        while heap:
            if _live(heap[0]):
                return heap[0][0]
            heapq.heappop(heap)
        return None

    def due(self, now: float) -> Iterator[PendingRequest]:
        """Pop and yield, soonest first, every pending request whose deadline is ``<= now``.

        The caller takes each one out of the queue before asking for the next.
        """
        heap = self._heap
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            if _live(entry):
                yield entry[2]

    def is_due(self, now: float) -> bool:
        """Cheap pre-check: whether any entry (maybe stale) is due at ``now``."""
        return bool(self._heap) and self._heap[0][0] <= now

    def rebuild(self, requests: Iterable[PendingRequest]) -> None:
        """Start over from the current deadlines of ``requests`` (after a timeout change)."""
        entries = [(r.deadline, r.request_id, r) for r in requests if r.deadline is not None]
        heapq.heapify(entries)
        self._heap = entries


class HealthTimers:
    """When each provider's health has something to do next (an ejection or a 429 hold ends, a
    probe is due): one heap of ``(time, sequence, slot)``, soonest first.

    Arming a slot again leaves its older entries in place: an entry is live while its time is
    still the slot's :meth:`~iop_edge.pool.health.ProviderHealth.next_time`; stale ones are
    dropped when they surface (and a stale one that comes due only costs an idle look).
    """

    __slots__ = ("_sequence", "heap")

    def __init__(self) -> None:
        #: read-only for the scheduler's cheap "anything due?" check on every operation
        self.heap: list[tuple[float, int, ProviderSlot]] = []
        self._sequence = 0

    def arm(self, slot: ProviderSlot) -> None:
        """Track ``slot``'s next health time, if it has one."""
        when = slot.health.next_time()
        if when is not None:
            self._sequence += 1
            heapq.heappush(self.heap, (when, self._sequence, slot))

    def soonest(self) -> float | None:
        """The earliest live health time, or ``None``."""
        heap = self.heap
        while heap and heap[0][2].health.next_time() != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def due(self, now: float) -> list[ProviderSlot]:
        """Pop every entry due at ``now``; the slots they name, each once, in time order."""
        heap = self.heap
        slots: dict[int, ProviderSlot] = {}
        while heap and heap[0][0] <= now:
            slot = heapq.heappop(heap)[2]
            slots.setdefault(id(slot), slot)
        return list(slots.values())
