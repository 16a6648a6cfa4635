"""Fair sharing of the pool among principals (SPEC §5.2): start-time fair queuing.

One :class:`PrincipalBook` per scheduler holds what is pool-wide: one :class:`Share` per
principal (its weight and ``max_in_flight`` cap, its leases in flight and requests queued) and
the fair-queuing clock. One :class:`FairQueue` per (model group, kind) holds that kind's pending
requests, in the order in which freed slots serve them.

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
heap) until :meth:`Share.release` brings it under its cap again, which returns the queues it put
back so the scheduler can hand them free slots.

Data structures, so that no operation costs O(pending): per queue and principal a FIFO lane (a
list with a moving front, with lazy removal as in :class:`~iop_edge.pool.decisions.RequestQueue`),
and per queue a heap of the lanes' heads ``(S, request_id, request)`` for the lanes that are not
parked, with stale entries dropped when they surface. ``push``, ``discard``, ``take`` and
``head`` cost O(log principals) amortized; only a live change of weights or mode
(:meth:`PrincipalBook.reweigh`) re-tags every pending request, in one pass. A principal's
counters live on its :class:`Share` (attributes, not dictionaries keyed by name: this is the
dispatch path); the book keeps one per principal it has seen, which the configured principals
(and ``anonymous``) bound.
"""

from __future__ import annotations

import heapq
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


class Share:
    """One principal's part of the book: its policy (``weight``, ``cap``) and its counts.

    ``max_queued`` caps its pending requests (the scheduler refuses past it).
    ``rejected`` counts its refusals by reason (kept by the scheduler).
    ``in_flight`` counts the leases it holds pool-wide (the scheduler reports them with
    :meth:`acquire` and :meth:`release`), ``queued`` its requests pending in the book's queues.
    ``elsewhere``: the leases it holds on the other edges sharing the pool; ``cap`` is its
    ``max_in_flight`` less those (``configured``: the policy's).
    Read-only for everyone but the book, its queues and the scheduler.
    """

    __slots__ = (
        "cap",
        "configured",
        "cost",
        "elsewhere",
        "finish",
        "in_flight",
        "max_queued",
        "name",
        "parked",
        "queued",
        "rejected",
        "weight",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.weight = 1.0
        self.cost = 1.0  # 1 / weight: how far one request advances its finish tag
        self.cap: int | None = None  # max_in_flight, less what it holds elsewhere
        self.configured: int | None = None  # max_in_flight
        self.elsewhere = 0
        self.max_queued: int | None = None
        self.in_flight = 0
        self.queued = 0
        self.finish = 0.0  # the finish tag of its latest request
        #: the queues holding its lanes parked because of its cap (empty: none)
        self.parked: list[FairQueue] = []
        self.rejected: dict[str, int] = {}

    @property
    def eligible(self) -> bool:
        """Whether it may take one more lease now (it is under its cap)."""
        cap = self.cap
        return cap is None or self.in_flight < cap

    def acquire(self) -> None:
        """It got a lease (from a queue or at once)."""
        self.in_flight += 1

    def release(self) -> Sequence[FairQueue]:
        """A lease of it was released. Returns the queues in which its requests were parked
        and now compete again (it fell under its cap): the scheduler offers their free slots to
        them. Empty on the happy path (nothing parked), without allocating."""
        self.in_flight -= 1
        if not self.parked:
            return _NOTHING
        cap = self.cap
        if cap is not None and self.in_flight >= cap:
            return _NOTHING
        queues, self.parked = self.parked, []
        for queue in queues:
            queue._unpark(self)
        return queues

    def __repr__(self) -> str:
        return (
            f"<Share {self.name!r} weight={self.weight:g} cap={self.cap} "
            f"in_flight={self.in_flight} queued={self.queued}>"
        )


class PrincipalBook:
    """The pool-wide state of fair sharing: a :class:`Share` per principal and the virtual
    clock of start-time fair queuing.

    A principal not named in ``weights`` has weight 1, one not named in ``caps``
    (``max_in_flight``) or ``queue_caps`` (``max_queued``) no such cap.
    """

    __slots__ = ("_caps", "_fair", "_mode", "_queue_caps", "_shares", "_virtual", "_weights")

    def __init__(
        self,
        weights: Mapping[str, float] | None = None,
        caps: Mapping[str, int] | None = None,
        mode: FairShareMode = "principal",
        queue_caps: Mapping[str, int] | None = None,
    ) -> None:
        self._shares: dict[str, Share] = {}
        self._weights: dict[str, float] = {}
        self._caps: dict[str, int] = {}
        self._queue_caps: dict[str, int] = {}
        self._mode: FairShareMode = mode
        self._fair = True
        self._virtual = 0.0
        self._set(weights or {}, caps or {}, mode, queue_caps or {})

    # -- reading -------------------------------------------------------------------------------

    @property
    def mode(self) -> FairShareMode:
        """The ``fair_share`` mode in force."""
        return self._mode

    @property
    def virtual_time(self) -> float:
        """The virtual time ``V``: the largest start tag dispatched so far (0 in mode none)."""
        return self._virtual

    @property
    def capped(self) -> bool:
        """Whether any principal has a ``max_in_flight`` (else everyone is always eligible)."""
        return bool(self._caps)

    def share(self, principal: str) -> Share:
        """The share of ``principal`` (made on first use, with the policy in force)."""
        share = self._shares.get(principal)
        if share is None:
            share = self._shares[principal] = Share(principal)
            self._apply(share)
        return share

    def shares(self) -> list[Share]:
        """Every share the book has, by name."""
        return sorted(self._shares.values(), key=_name)

    def in_flight(self, principal: str) -> int:
        """How many leases ``principal`` holds, pool-wide."""
        share = self._shares.get(principal)
        return 0 if share is None else share.in_flight

    def queued(self, principal: str) -> int:
        """How many requests of ``principal`` wait in this book's queues."""
        share = self._shares.get(principal)
        return 0 if share is None else share.queued

    def eligible(self, principal: str) -> bool:
        """Whether ``principal`` may take one more lease now (it is under its cap)."""
        return self.share(principal).eligible

    # -- leases (by name; the scheduler calls its request's share directly) ---------------------

    def acquire(self, principal: str) -> None:
        """``principal`` got a lease (see :meth:`Share.acquire`)."""
        self.share(principal).acquire()

    def release(self, principal: str) -> Sequence[FairQueue]:
        """A lease of ``principal`` was released (see :meth:`Share.release`)."""
        return self.share(principal).release()

    def set_elsewhere(self, principal: str, held: int) -> Sequence[FairQueue]:
        """``principal`` holds ``held`` leases on the other edges sharing the pool (they count
        against its ``max_in_flight``). Returns the queues where its requests were parked and
        now compete again (it fell under its cap), as :meth:`Share.release` does."""
        share = self.share(principal)
        share.elsewhere = held
        self._apply(share)
        if not share.parked or not share.eligible:
            return _NOTHING
        queues, share.parked = share.parked, []
        for queue in queues:
            queue._unpark(share)
        return queues

    # -- live changes --------------------------------------------------------------------------

    def reweigh(
        self,
        queues: Iterable[FairQueue],
        *,
        weights: Mapping[str, float],
        caps: Mapping[str, int],
        mode: FairShareMode,
        queue_caps: Mapping[str, int] | None = None,
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
        self._set(weights, caps, mode, queue_caps or {})
        for share in self._shares.values():
            share.parked = []
        if retag:
            pending = [request for queue in queues for request in queue._pending()]
            pending.sort(key=_arrival)
            for share in self._shares.values():
                share.finish = 0.0
            for request in pending:
                request.start = self._tag(request.share)
        for queue in queues:
            queue._rebuild()
        return [queue for queue in queues if queue.live]

    def _set(
        self,
        weights: Mapping[str, float],
        caps: Mapping[str, int],
        mode: FairShareMode,
        queue_caps: Mapping[str, int],
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
        problems.extend(
            f"principals[{ref}].max_queued: {cap!r} is negative; max_queued must be >= 0"
            for ref, cap in queue_caps.items()
            if not cap >= 0
        )
        if mode not in FAIR_SHARE_MODES:
            problems.append(f"fair_share: {mode!r} is not one of principal, token, none")
        if problems:
            raise ValueError("; ".join(problems))
        self._weights = {ref: float(weight) for ref, weight in weights.items()}
        self._caps = dict(caps)
        self._queue_caps = dict(queue_caps)
        self._mode = mode
        self._fair = mode != "none"
        for share in self._shares.values():
            self._apply(share)

    def _apply(self, share: Share) -> None:
        share.weight = self._weights.get(share.name, 1.0)
        share.cost = 1.0 / share.weight
        cap = share.configured = self._caps.get(share.name)
        share.cap = None if cap is None else max(0, cap - share.elsewhere)
        share.max_queued = self._queue_caps.get(share.name)

    def _tag(self, share: Share) -> float:
        """The start tag of a new request of ``share``; advances its finish tag."""
        if not self._fair:
            return 0.0
        virtual = self._virtual
        finish = share.finish
        start = finish if finish > virtual else virtual
        share.finish = start + share.cost
        return start


def _arrival(request: PendingRequest) -> int:
    return request.request_id


def _name(share: Share) -> str:
    return share.name


class _Lane(list[PendingRequest]):
    """The requests of one principal in one queue, oldest first, with lazy removal: ``live``
    of them are still pending here, and the front is at index ``first``.

    A list with a moving front rather than a deque: most lanes hold a request or two, and an
    empty deque alone weighs more than half a kilobyte.
    """

    __slots__ = ("first", "live", "parked")

    def __init__(self) -> None:
        super().__init__()
        self.first = 0
        self.live = 0
        self.parked = False

    def advance(self, queue: FairQueue) -> PendingRequest:
        """Drop the front request and any after it that left ``queue``; return the new front
        (the caller knows one is live)."""
        first = self.first + 1
        while self[first].queue is not queue:
            first += 1
        if first > 16 and 2 * first > len(self):
            del self[:first]  # the departed front is more than half the list: shed it
            first = 0
        self.first = first
        return self[first]

    def keep(self, queue: FairQueue) -> None:
        """Drop every request that left ``queue``."""
        self[:] = [r for r in self if r.queue is queue]
        self.first = 0

    def empty(self) -> None:
        """Forget every request (none is live)."""
        self.clear()
        self.first = 0


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
        self._lanes: dict[Share, _Lane] = {}
        self._heap: list[HeadEntry] = []

    @property
    def book(self) -> PrincipalBook:
        """The book of principals this queue shares with the pool's other queues."""
        return self._book

    def push(self, request: PendingRequest, principal: str | None = None) -> None:
        """Queue ``request``: tag it, and put it last among its principal's requests.

        Its principal is ``principal`` if given, else the share the scheduler set on it, else
        ``anonymous``.
        """
        book = self._book
        share: Share | None = request.share
        if principal is not None or share is None:
            share = request.share = book.share(principal or ANONYMOUS)
        start = book._tag(share) if book._fair else 0.0
        request.queue = self
        request.start = start
        share.queued += 1
        self.live += 1
        lane = self._lanes.get(share)
        if lane is None:
            lane = self._lanes[share] = _Lane()
        lane.append(request)
        lane.live += 1
        if lane.live == 1 and not lane.parked:
            heap = self._heap
            heapq.heappush(heap, (start, request.request_id, request))
            if len(heap) > 2 * len(self._lanes) + 64:
                self._compact()

    def restore(self, request: PendingRequest) -> None:
        """Put back ``request``, taken from here for a dispatch that did not happen (the shared
        store refused its lease), first among its principal's requests and with its start tag:
        it keeps its place. One dispatched at once, never queued, keeps its tag of 0 and so
        goes first too: nothing waiting now arrived before it."""
        share = request.share
        request.queue = self
        share.queued += 1
        self.live += 1
        lane = self._lanes.get(share)
        if lane is None:
            lane = self._lanes[share] = _Lane()
        if lane.first:
            lane.first -= 1
            lane[lane.first] = request
        else:
            lane.insert(0, request)
        lane.live += 1
        if not lane.parked:
            heapq.heappush(self._heap, (request.start, request.request_id, request))

    def head(self) -> PendingRequest | None:
        """The request a slot of this queue's kind goes to next, or ``None``: nothing pending,
        or only requests of principals at their cap (those are parked on the way)."""
        heap = self._heap
        while heap:
            request = heap[0][2]
            if request.queue is self:
                share = request.share
                cap = share.cap
                if cap is None or share.in_flight < cap:
                    return request
                # At its cap: set its lane aside until its share says it is under again.
                self.park(share)
            heapq.heappop(heap)
        return None

    def park(self, share: Share) -> None:
        """Set ``share``'s lane here aside (its principal is at its cap) until
        :meth:`Share.release` brings it back. The scheduler parks at once a request that
        queues only because of its principal's cap (a slot was free for it): nothing else would
        offer it that slot once the principal is under its cap again."""
        lane = self._lanes.get(share)
        if lane is None:
            lane = self._lanes[share] = _Lane()
        if not lane.parked:
            lane.parked = True
            share.parked.append(self)

    def take(self, request: PendingRequest) -> None:
        """``request`` (pending here) was dispatched: remove it and advance the virtual time.

        The scheduler still reports the lease with :meth:`Share.acquire`.
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
        share = request.share
        share.queued -= 1
        self.live -= 1
        lane = self._lanes[share]
        lane.live -= 1
        if not lane.live:
            if lane.parked:
                lane.empty()  # kept: its share will unpark it
            else:
                del self._lanes[share]  # so the lanes (and the heap's bound) follow the live ones
            return
        if lane[lane.first] is not request:
            if len(lane) - lane.first > 2 * lane.live + 16:
                # Many departures from the middle: compact so memory follows the live count.
                lane.keep(self)
            return
        # The lane's head left: its next live request becomes the head, and takes its place
        # in the heap (in one step if the old head's entry is on top: the dispatch path).
        after = lane.advance(self)
        if lane.parked:
            return
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
        return [r for lane in self._lanes.values() for r in lane if r.queue is self]

    def _unpark(self, share: Share) -> None:
        lane = self._lanes[share]
        lane.parked = False
        if not lane.live:
            del self._lanes[share]
        else:
            head = lane[lane.first]
            if head.queue is not self:
                head = lane.advance(self)
            heapq.heappush(self._heap, (head.start, head.request_id, head))

    def _rebuild(self) -> None:
        """Every lane unparked, the heap rebuilt from the lanes' heads (after a reweigh)."""
        heap: list[HeadEntry] = []
        lanes = self._lanes
        for share in list(lanes):
            lane = lanes[share]
            lane.parked = False
            if not lane.live:
                del lanes[share]
                continue
            lane.keep(self)
            head = lane[0]
            heap.append((head.start, head.request_id, head))
        heapq.heapify(heap)
        self._heap = heap

    def _compact(self) -> None:
        """Drop the heap's stale entries (their request left, or its lane is parked)."""
        lanes = self._lanes
        live = []
        for entry in self._heap:
            request = entry[2]
            if request.queue is self and not lanes[request.share].parked:
                live.append(entry)
        heapq.heapify(live)
        self._heap = live
