"""Fair sharing of the pool among principals (SPEC §5.2): start-time fair queuing.

One :class:`PrincipalBook` per scheduler holds what is pool-wide: each principal's weight and
``max_in_flight`` cap, its leases in flight and requests queued, and the fair-queuing clock. One
:class:`FairQueue` per (model group, kind) holds that kind's pending requests, in the order in
which freed slots serve them.

The order (start-time fair queuing, SFQ): the book keeps a virtual time ``V`` and, per principal
``p``, the finish tag ``F[p]`` of its latest request. A request of ``p`` pushed gets the start
tag ``S = max(V, F[p])`` and sets ``F[p] = S + 1 / weight[p]``; its key is ``(S, request_id)``
(equal tags: the older first). Dispatching a request sets ``V = max(V, S)``. So under load each
principal advances by ``1 / weight`` per request served and a weight-3 principal gets three
requests for every one of a weight-1 principal; a principal that was idle starts at ``V`` (it
banks no credit while away, and waits behind no one else's backlog); within a principal the tags
grow, so its requests go oldest first. The tags are shared by every queue of the book, so the
heads of two queues compare by key (:func:`service_key`), pool-wide. With ``mode="none"`` every
tag is 0: the key is the arrival order across everyone (one FIFO, the behaviour before §5.2).

A principal at its ``max_in_flight`` is skipped, not refused: the first time its request comes
up in :meth:`FairQueue.head`, its requests in that queue are parked aside (out of the queue's
heap) until :meth:`PrincipalBook.release` brings it under its cap again, which returns the queues
it put back so the scheduler can hand them free slots.

Data structures, so that no operation costs O(pending): per queue and principal a FIFO lane
(a deque, with lazy removal as in :class:`~iop_edge.pool.decisions.RequestQueue`), and per queue
a heap of the lanes' heads ``(S, request_id, request)`` for the lanes that are not parked, with
stale entries dropped when they surface. ``push``, ``discard``, ``take`` and ``head`` cost
O(log principals) amortized; only a live change of weights or mode (:meth:`PrincipalBook.
reweigh`) re-tags every pending request, in one pass.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Literal

from iop_edge.pool.decisions import PendingRequest, RequestQueue

FairShareMode = Literal["principal", "token", "none"]
"""``provider_pool.fair_share``: ``principal`` and ``token`` share by weight (they differ only
in what names a principal, which the caller decides); ``none`` is one arrival-order queue."""

ANONYMOUS = "anonymous"
"""The principal of every request when no principal tokens are configured (SPEC §5.2)."""

FAIR_SHARE_MODES: tuple[FairShareMode, ...] = ("principal", "token", "none")

HeadEntry = tuple[float, int, PendingRequest]

_NOTHING: tuple[FairQueue, ...] = ()


def service_key(request: PendingRequest) -> tuple[float, int]:
    """The key a pending request is served by, pool-wide: the smallest goes first."""
    return (request.start, request.request_id)


class PrincipalBook:
    """The pool-wide state of fair sharing: weights, caps, leases in flight, requests queued,
    and the virtual clock of start-time fair queuing.

    The scheduler reports every lease of a principal with :meth:`acquire` and :meth:`release`
    (whether the request queued or not); the :class:`FairQueue` objects built on this book
    report what they queue. A principal not named in ``weights`` has weight 1, one not named in
    ``caps`` no cap.
    """

    __slots__ = (
        "_caps",
        "_costs",
        "_fair",
        "_finish",
        "_in_flight",
        "_mode",
        "_parked",
        "_queued",
        "_virtual",
        "_weights",
    )

    def __init__(
        self,
        weights: Mapping[str, float] | None = None,
        caps: Mapping[str, int] | None = None,
        mode: FairShareMode = "principal",
    ) -> None:
        self._weights: dict[str, float] = {}
        self._costs: dict[str, float] = {}
        self._caps: dict[str, int] = {}
        self._mode: FairShareMode = mode
        self._fair = True
        self._set(weights or {}, caps or {}, mode)
        self._virtual = 0.0
        self._finish: dict[str, float] = {}
        self._in_flight: dict[str, int] = {}
        self._queued: dict[str, int] = {}
        #: principals whose lanes are parked because of their cap, and the queues holding them
        self._parked: dict[str, list[FairQueue]] = {}

    # -- reading -------------------------------------------------------------------------------

    @property
    def mode(self) -> FairShareMode:
        """The ``fair_share`` mode in force."""
        return self._mode

    @property
    def virtual_time(self) -> float:
        """The virtual time ``V``: the largest start tag dispatched so far (0 in mode none)."""
        return self._virtual

    def weight(self, principal: str) -> float:
        """The weight of ``principal`` (1 unless configured)."""
        return self._weights.get(principal, 1.0)

    def cap(self, principal: str) -> int | None:
        """The ``max_in_flight`` of ``principal``, or ``None``: no cap."""
        return self._caps.get(principal)

    def in_flight(self, principal: str) -> int:
        """How many leases ``principal`` holds, pool-wide."""
        return self._in_flight.get(principal, 0)

    def queued(self, principal: str) -> int:
        """How many requests of ``principal`` wait in this book's queues."""
        return self._queued.get(principal, 0)

    @property
    def capped(self) -> bool:
        """Whether any principal has a ``max_in_flight`` (else everyone is always eligible)."""
        return bool(self._caps)

    def eligible(self, principal: str) -> bool:
        """Whether ``principal`` may take one more lease now (it is under its cap)."""
        cap = self._caps.get(principal)
        return cap is None or self._in_flight.get(principal, 0) < cap

    # -- leases ------------------------------------------------------------------------------

    def acquire(self, principal: str) -> None:
        """``principal`` got a lease (from a queue or at once)."""
        in_flight = self._in_flight
        in_flight[principal] = in_flight.get(principal, 0) + 1

    def release(self, principal: str) -> Sequence[FairQueue]:
        """A lease of ``principal`` was released. Returns the queues in which its requests were
        parked and now compete again (it fell under its cap): the scheduler offers their free
        slots to them. Empty on the happy path (no cap), without allocating."""
        in_flight = self._in_flight
        count = in_flight[principal] - 1
        if count:
            in_flight[principal] = count
        else:
            del in_flight[principal]  # so the dict follows the principals holding leases
        if principal not in self._parked:
            return _NOTHING
        cap = self._caps.get(principal)
        if cap is not None and count >= cap:
            return _NOTHING
        queues = self._parked.pop(principal)
        for queue in queues:
            queue._unpark(principal)
        return queues

    # -- live changes --------------------------------------------------------------------------

    def reweigh(
        self,
        queues: Iterable[FairQueue],
        *,
        weights: Mapping[str, float],
        caps: Mapping[str, int],
        mode: FairShareMode,
    ) -> list[FairQueue]:
        """Take new weights, caps and mode live; ``queues`` are all the queues of this book.

        No request is lost and each keeps its identity, its queue and its place among the
        requests of its principal. A change of weights or mode re-tags every pending request
        (O(pending log pending), once): in arrival order, as if each had just been pushed with
        ``V`` unchanged, so the backlogs start level. A change of caps alone keeps the tags;
        every parked principal is put back (one over a lowered cap is parked again when its
        request comes up; a lowered cap evicts nothing). Returns the queues that hold pending
        requests, for the scheduler to offer its free slots to.
        """
        queues = list(queues)
        retag = mode != self._mode or dict(weights) != self._weights
        self._set(weights, caps, mode)
        self._parked.clear()
        if retag:
            pending = [request for queue in queues for request in queue._pending()]
            pending.sort(key=_arrival)
            self._finish.clear()
            for request in pending:
                request.start = self._tag(request.principal)
        for queue in queues:
            queue._rebuild()
        return [queue for queue in queues if queue.live]

    def _set(
        self, weights: Mapping[str, float], caps: Mapping[str, int], mode: FairShareMode
    ) -> None:
        problems = [
            f"principals[{ref}].weight: {weight!r} is not positive; weight must be > 0"
            for ref, weight in weights.items()
            if not weight > 0
        ]
        problems.extend(
            f"principals[{ref}].max_in_flight: {cap!r} is not positive; max_in_flight must be > 0"
            for ref, cap in caps.items()
            if not cap > 0
        )
        if mode not in FAIR_SHARE_MODES:
            problems.append(f"fair_share: {mode!r} is not one of principal, token, none")
        if problems:
            raise ValueError("; ".join(problems))
        self._weights = {ref: float(weight) for ref, weight in weights.items()}
        self._costs = {ref: 1.0 / weight for ref, weight in self._weights.items()}
        self._caps = dict(caps)
        self._mode = mode
        self._fair = mode != "none"

    def _tag(self, principal: str) -> float:
        """The start tag of a new request of ``principal``; advances its finish tag."""
        if not self._fair:
            return 0.0
        finish = self._finish
        virtual = self._virtual
        last = finish.get(principal, virtual)
        start = last if last > virtual else virtual
        finish[principal] = start + self._costs.get(principal, 1.0)
        return start

    def _park(self, principal: str, queue: FairQueue) -> None:
        parked = self._parked.get(principal)
        if parked is None:
            self._parked[principal] = [queue]
        else:
            parked.append(queue)


def _arrival(request: PendingRequest) -> int:
    return request.request_id


class _Lane:
    """The requests of one principal in one queue, oldest first, with lazy removal."""

    __slots__ = ("entries", "live", "parked")

    def __init__(self) -> None:
        self.entries: deque[PendingRequest] = deque()
        self.live = 0
        self.parked = False


class FairQueue(RequestQueue):
    """The pending requests of one (model group, kind), served fairly across principals.

    A drop-in :class:`~iop_edge.pool.decisions.RequestQueue` (``push``, ``head``, ``discard``,
    ``live``, ``len``, iteration): ``request.queue`` and the scheduler's queue slots keep their
    type. The inherited ``entries`` deque stays empty: the per-principal lanes hold the requests.

    :meth:`head` is the request with the smallest :func:`service_key` whose principal is under
    its cap; :meth:`take` removes it when it is dispatched, :meth:`discard` removes any request
    (cancel, expiry, a dropped group) lazily. A request is pending here while ``request.queue``
    is this queue, and is pushed at most once. ``group_id`` and ``long_context`` say which
    (model group, kind) it serves, for the scheduler.
    """

    __slots__ = ("_book", "_heap", "_lanes", "group_id", "long_context")

    def __init__(self, book: PrincipalBook, group_id: str = "", long_context: bool = False) -> None:
        super().__init__()
        self._book = book
        self.group_id = group_id
        self.long_context = long_context
        self._lanes: dict[str, _Lane] = {}
        self._heap: list[HeadEntry] = []

    @property
    def book(self) -> PrincipalBook:
        """The book of principals this queue shares with the pool's other queues."""
        return self._book

    def push(self, request: PendingRequest, principal: str = ANONYMOUS) -> None:
        """Queue ``request`` of ``principal``: tag it, and put it last among that principal's."""
        book = self._book
        start = book._tag(principal) if book._fair else 0.0
        request.queue = self
        request.principal = principal
        request.start = start
        queued = book._queued
        queued[principal] = queued.get(principal, 0) + 1
        self.live += 1
        lane = self._lanes.get(principal)
        if lane is None:
            lane = self._lanes[principal] = _Lane()
        lane.entries.append(request)
        lane.live += 1
        if lane.live == 1 and not lane.parked:
            heap = self._heap
            heapq.heappush(heap, (start, request.request_id, request))
            if len(heap) > 2 * len(self._lanes) + 64:
                self._compact()

    def head(self) -> PendingRequest | None:
        """The request a slot of this queue's kind goes to next, or ``None``: nothing pending,
        or only requests of principals at their cap (those are parked on the way)."""
        heap = self._heap
        caps = self._book._caps
        while heap:
            request = heap[0][2]
            if request.queue is self:
                if not caps:
                    return request
                principal = request.principal
                cap = caps.get(principal)
                if cap is None or self._book._in_flight.get(principal, 0) < cap:
                    return request
                # At its cap: set its lane aside until the book says it is under again.
                self._lanes[principal].parked = True
                self._book._park(principal, self)
            heapq.heappop(heap)
        return None

    def take(self, request: PendingRequest) -> None:
        """``request`` (pending here) was dispatched: remove it and advance the virtual time.

        The scheduler still reports the lease with :meth:`PrincipalBook.acquire`.
        """
        book = self._book
        if request.start > book._virtual:
            book._virtual = request.start
        self.discard(request)

    def pop(self) -> PendingRequest | None:
        """:meth:`head`, then :meth:`take` it."""
        request = self.head()
        if request is not None:
            self.take(request)
        return request

    def discard(self, request: PendingRequest) -> None:
        """Take ``request`` out of the queue (lazily), whatever its position."""
        request.queue = None
        principal = request.principal
        book = self._book
        queued = book._queued
        count = queued[principal] - 1
        if count:
            queued[principal] = count
        else:
            del queued[principal]
        self.live -= 1
        lane = self._lanes[principal]
        lane.live -= 1
        entries = lane.entries
        if not lane.live:
            entries.clear()
            return
        if entries[0] is not request:
            if len(entries) > 2 * lane.live + 16:
                # Many departures from the middle: compact so memory follows the live count.
                lane.entries = deque(r for r in entries if r.queue is self)
            return
        # The lane's head left: its next live request becomes the head, and takes its place
        # in the heap (in one step if the old head's entry is on top: the dispatch path).
        entries.popleft()
        while entries[0].queue is not self:
            entries.popleft()
        if lane.parked:
            return
        after = entries[0]
        entry = (after.start, after.request_id, after)
        heap = self._heap
        if heap and heap[0][2] is request:
            heapq.heapreplace(heap, entry)
        else:
            heapq.heappush(heap, entry)
            if len(heap) > 2 * len(self._lanes) + 64:
                self._compact()

    def __iter__(self) -> Iterator[PendingRequest]:
        """Iterate over the requests pending here in service order (caps aside)."""
        return iter(sorted(self._pending(), key=service_key))

    def __len__(self) -> int:
        return self.live

    def __repr__(self) -> str:
        kind = "long" if self.long_context else "general"
        return f"<FairQueue {self.group_id!r} {kind} pending={self.live}>"

    # -- for the book --------------------------------------------------------------------------

    def _pending(self) -> list[PendingRequest]:
        return [r for lane in self._lanes.values() for r in lane.entries if r.queue is self]

    def _unpark(self, principal: str) -> None:
        lane = self._lanes[principal]
        lane.parked = False
        if lane.live:
            entries = lane.entries
            while entries[0].queue is not self:
                entries.popleft()
            head = entries[0]
            heapq.heappush(self._heap, (head.start, head.request_id, head))

    def _rebuild(self) -> None:
        """Every lane unparked, the heap rebuilt from the lanes' heads (after a reweigh)."""
        heap: list[HeadEntry] = []
        lanes = self._lanes
        for principal in list(lanes):
            lane = lanes[principal]
            lane.parked = False
            if not lane.live:
                del lanes[principal]
                continue
            lane.entries = deque(r for r in lane.entries if r.queue is self)
            head = lane.entries[0]
            heap.append((head.start, head.request_id, head))
        heapq.heapify(heap)
        self._heap = heap

    def _compact(self) -> None:
        """Drop the heap's stale entries (their request left, or its lane is parked)."""
        lanes = self._lanes
        live = [
            entry
            for entry in self._heap
            if entry[2].queue is self and not lanes[entry[2].principal].parked
        ]
        heapq.heapify(live)
        self._heap = live
