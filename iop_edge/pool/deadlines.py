"""The deadlines of pending requests: one heap, soonest first, with lazy removal.

A request that leaves the queue (dispatched, cancelled, dropped) or whose deadline is recomputed
keeps its old entry until it surfaces; the heap is compacted when stale entries outnumber live
ones, so memory follows the queue and every operation stays O(log n) amortized.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

from iop_edge.pool.decisions import PendingRequest

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
