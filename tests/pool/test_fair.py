"""Tests of fair queuing among principals (SPEC §5.2, :mod:`iop_edge.pool.fair`).

One plain test per rule, then a Hypothesis state machine against a naive model of start-time
fair queuing (every key recomputed from the formulas, every head found by a scan), and a
property on the shares served under saturation.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from iop_edge.pool import FairQueue, FairShareMode, PendingRequest, PrincipalBook, service_key
from iop_edge.pool.decisions import RequestQueue


class Arrivals:
    """Makes requests with increasing ids (the scheduler's global arrival sequence)."""

    def __init__(self) -> None:
        self.ids = itertools.count(1)

    def push(self, queue: FairQueue, principal: str, n: int = 1) -> list[PendingRequest]:
        requests = []
        for _ in range(n):
            request = PendingRequest(next(self.ids), queue.group_id or "g", False, 0.0)
            queue.push(request, principal)
            requests.append(request)
        return requests


def serve(queue: FairQueue, n: int, *, hold: bool = False) -> list[PendingRequest]:
    """Dispatch ``n`` heads (fewer if the queue runs dry); ``hold`` keeps their leases."""
    served = []
    for _ in range(n):
        request = queue.head()
        if request is None:
            break
        queue.take(request)
        request.share.acquire()
        if not hold:
            request.share.release()
        served.append(request)
    return served


def test_weights_3_to_1_give_a_3_to_1_share_under_saturation():
    queue = FairQueue(PrincipalBook(weights={"batch": 1, "chat": 3}))
    arrivals = Arrivals()
    for _ in range(400):
        arrivals.push(queue, "batch")
        arrivals.push(queue, "chat")
    shares = Counter(r.principal for r in serve(queue, 400))
    assert shares == {"chat": 300, "batch": 100}


def test_new_principal_is_not_starved_by_an_old_backlog():
    """The issue-13 scenario: B arrives behind A's 30-request flood and goes next."""
    queue = FairQueue(PrincipalBook())
    arrivals = Arrivals()
    arrivals.push(queue, "a", 30)
    serve(queue, 2)
    (b,) = arrivals.push(queue, "b")
    assert queue.head() is b
    assert b.start == queue.book.virtual_time == 1.0


def test_an_idle_principal_cannot_bank_credit():
    """S = max(V, F_p): a principal that was away starts at the virtual time, not before."""
    queue = FairQueue(PrincipalBook())
    arrivals = Arrivals()
    arrivals.push(queue, "a", 50)
    serve(queue, 40)  # b idle all along: V reaches 39
    arrivals.push(queue, "b", 20)
    order = "".join(r.principal for r in serve(queue, 20))
    # b does not get the 40 turns it missed: it alternates with a's remaining 10.
    assert order == "ba" * 10


def test_oldest_first_within_a_principal():
    queue = FairQueue(PrincipalBook(weights={"a": 2}))
    arrivals = Arrivals()
    for principal in "aabbbabaab":
        arrivals.push(queue, principal)
    served = serve(queue, 10)
    for principal in "ab":
        ids = [r.request_id for r in served if r.principal == principal]
        assert ids == sorted(ids)


def test_a_capped_principal_is_skipped_then_restored_in_order():
    book = PrincipalBook(caps={"a": 1})
    queue = FairQueue(book)
    arrivals = Arrivals()
    a1, a2, a3 = arrivals.push(queue, "a", 3)
    b1, b2 = arrivals.push(queue, "b", 2)
    assert serve(queue, 1, hold=True) == [a1]
    assert book.in_flight("a") == 1
    assert queue.head() is b1  # a is at its cap: skipped, not refused
    assert serve(queue, 1, hold=True) == [b1]
    assert queue.head() is b2
    assert book.release("a") == [queue]  # under its cap again: its lane is back
    assert serve(queue, 3) == [a2, b2, a3]
    assert len(queue) == 0


def test_a_principal_at_its_cap_leaves_nothing_eligible():
    book = PrincipalBook(caps={"a": 1})
    queue = FairQueue(book)
    arrivals = Arrivals()
    book.acquire("a")  # a lease taken at once, without queueing
    (a1,) = arrivals.push(queue, "a")
    assert queue.head() is None
    assert len(queue) == 1
    assert book.queued("a") == 1
    assert book.release("a") == [queue]
    assert queue.head() is a1


def test_release_under_the_cap_restores_the_lanes_of_every_queue():
    book = PrincipalBook(caps={"a": 2})
    general = FairQueue(book, "g1", long_context=False)
    long = FairQueue(book, "g2", long_context=True)
    arrivals = Arrivals()
    book.acquire("a")
    book.acquire("a")
    (g,) = arrivals.push(general, "a")
    (lo,) = arrivals.push(long, "a")
    assert (general.head(), long.head()) == (None, None)
    book.acquire("a")  # over the cap (a cap lowered live): one release is not enough
    assert book.release("a") == ()
    assert (general.head(), long.head()) == (None, None)
    assert set(book.release("a")) == {general, long}
    assert (general.head(), long.head()) == (g, lo)


def test_a_fair_queue_stands_in_for_a_request_queue():
    """Without principal tokens every request is the principal ``anonymous`` (SPEC §5.2)."""
    queue = FairQueue(PrincipalBook(), "chat", long_context=True)
    assert isinstance(queue, RequestQueue)
    first = PendingRequest(1, "chat", True, 0.0)
    second = PendingRequest(2, "chat", True, 0.0)
    queue.push(first)
    queue.push(second)
    assert (first.principal, first.queue, queue.live, queue.head()) == (
        "anonymous",
        queue,
        2,
        first,
    )
    assert queue.book.queued("anonymous") == 2
    assert serve(queue, 3) == [first, second]
    assert (queue.head(), len(queue), queue.book.queued("anonymous")) == (None, 0, 0)


def test_release_without_caps_returns_nothing():
    book = PrincipalBook()
    book.acquire("a")
    assert book.release("a") == ()
    assert book.in_flight("a") == 0


def test_discard_from_the_middle():
    book = PrincipalBook()
    queue = FairQueue(book)
    arrivals = Arrivals()
    a1, a2, a3, a4, a5 = arrivals.push(queue, "a", 5)
    (b1,) = arrivals.push(queue, "b")
    queue.discard(a3)
    queue.discard(a1)  # the head of its lane, and of the queue
    assert (a3.queue, a1.queue) == (None, None)
    assert (len(queue), book.queued("a"), book.queued("b")) == (4, 3, 1)
    assert list(queue) == [b1, a2, a4, a5]  # b1's tag is 0, a2's is 1
    assert serve(queue, 5) == [b1, a2, a4, a5]


def test_discard_many_from_the_middle_keeps_the_order():
    queue = FairQueue(PrincipalBook())
    arrivals = Arrivals()
    requests = arrivals.push(queue, "a", 300)
    for request in requests[1:-1:3]:
        queue.discard(request)
    kept = [r for i, r in enumerate(requests) if i == 0 or i % 3 != 1 or i == 299]
    assert list(queue) == kept
    assert serve(queue, 300) == kept


def test_reweigh_keeps_every_request_and_fifo_within_each_principal():
    book = PrincipalBook()
    queues = [FairQueue(book, "g1"), FairQueue(book, "g2")]
    arrivals = Arrivals()
    for i, principal in enumerate("abcabcaaabbbcab" * 4):
        arrivals.push(queues[i % 2], principal)
    before = {q: list(q) for q in queues}
    serve(queues[0], 3)
    kept = {
        q: sorted((r for r in before[q] if r.queue is q), key=lambda r: r.request_id)
        for q in queues
    }
    ready = book.reweigh(queues, weights={"a": 4, "b": 0.5}, caps={}, mode="principal")
    assert ready == queues
    for queue in queues:
        after = list(queue)
        assert sorted(after, key=lambda r: r.request_id) == kept[queue]  # same objects
        for principal in "abc":
            ids = [r.request_id for r in after if r.principal == principal]
            assert ids == sorted(ids)
    # The new weights rule from now on: a (4) gets 8 of every 13 turns, b (0.5) 1.
    shares = Counter(r.principal for r in serve(queues[0], 13))
    assert shares["a"] >= shares["c"] >= shares["b"]


def test_reweigh_with_new_caps_only_keeps_the_tags():
    book = PrincipalBook(caps={"a": 1})
    queue = FairQueue(book)
    arrivals = Arrivals()
    arrivals.push(queue, "a", 3)
    arrivals.push(queue, "b", 3)
    serve(queue, 1, hold=True)  # a1 (tag 0): a is at its cap
    tags = [(r.request_id, r.start) for r in queue]
    assert [r.principal for r in serve(queue, 2, hold=True)] == ["b", "b"]  # b1, b2 (0, 1)
    assert book.reweigh([queue], weights={}, caps={"a": 2}, mode="principal") == [queue]
    assert [(r.request_id, r.start) for r in queue] == [t for t in tags if t[0] in (2, 3, 6)]
    # The raised cap lets a in at once, in its place: a2 (tag 1) before b3 (tag 2).
    assert [r.request_id for r in serve(queue, 3)] == [2, 3, 6]


def test_a_lowered_cap_evicts_nothing():
    book = PrincipalBook()
    queue = FairQueue(book)
    arrivals = Arrivals()
    arrivals.push(queue, "a", 4)
    serve(queue, 2, hold=True)
    book.reweigh([queue], weights={}, caps={"a": 1}, mode="principal")
    assert (len(queue), book.in_flight("a"), queue.head()) == (2, 2, None)
    assert book.release("a") == ()  # 1 in flight: still at the cap
    assert book.release("a") == [queue]
    assert queue.head() is not None


def test_mode_none_is_one_arrival_order_queue():
    queue = FairQueue(PrincipalBook(weights={"b": 10}, mode="none"))
    arrivals = Arrivals()
    pushed = []
    for principal in "aaaaabababbbcc":
        pushed += arrivals.push(queue, principal)
    assert serve(queue, len(pushed)) == pushed
    assert queue.book.virtual_time == 0.0


def test_switching_mode_reorders_the_pending_set_without_losing_any():
    book = PrincipalBook(mode="none")
    queue = FairQueue(book)
    arrivals = Arrivals()
    flood = arrivals.push(queue, "a", 10)
    (b,) = arrivals.push(queue, "b")
    assert queue.head() is flood[0]
    book.reweigh([queue], weights={}, caps={}, mode="principal")
    assert sorted(queue, key=service_key)[:2] == [flood[0], b]
    assert serve(queue, 11) == [flood[0], b, *flood[1:]]
    book.reweigh([queue], weights={}, caps={}, mode="none")
    pushed = arrivals.push(queue, "a", 2) + arrivals.push(queue, "b", 2)
    assert serve(queue, 4) == pushed


def test_invalid_weights_and_caps_are_refused_with_every_problem():
    with pytest.raises(ValueError, match=r"principals\[a\]\.weight: 0 is not positive") as info:
        PrincipalBook(weights={"a": 0}, caps={"b": -1})
    assert "principals[b].max_in_flight: -1 is not positive" in str(info.value)
    book = PrincipalBook()
    with pytest.raises(ValueError, match="fair_share: 'fifo' is not one of"):
        book.reweigh([], weights={}, caps={}, mode="fifo")  # type: ignore[arg-type]


# -- shares under saturation -------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    weights=st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0, 5.0]), min_size=2, max_size=5),
    order=st.randoms(use_true_random=False),
)
def test_served_shares_follow_the_weights_under_saturation(weights, order):
    """SFQ's bound: while principals i and j stay backlogged, the requests served to them
    differ from their weights' ratio by less than one request each:
    ``|served_i / w_i - served_j / w_j| <= 1 / w_i + 1 / w_j``."""
    principals = [f"p{i}" for i in range(len(weights))]
    book = PrincipalBook(weights=dict(zip(principals, weights, strict=True)))
    queue = FairQueue(book)
    arrivals = Arrivals()
    rounds = 300
    backlog = [p for p in principals for _ in range(rounds)]
    order.shuffle(backlog)  # arrival order must not matter
    for principal in backlog:
        arrivals.push(queue, principal)
    served = Counter(r.principal for r in serve(queue, rounds))  # nobody runs dry
    for (i, wi), (j, wj) in itertools.combinations(zip(principals, weights, strict=True), 2):
        assert abs(served[i] / wi - served[j] / wj) <= 1 / wi + 1 / wj


# -- state machine ------------------------------------------------------------------------------

PRINCIPALS = ["a", "b", "c", "d"]
WEIGHTS = st.dictionaries(st.sampled_from(PRINCIPALS), st.sampled_from([0.5, 1.0, 2.0, 3.0]))
CAPS = st.dictionaries(st.sampled_from(PRINCIPALS), st.integers(1, 3))
MODES = st.sampled_from(["principal", "token", "none"])


class Model:
    """Start-time fair queuing computed naively: a list of pending requests and the formulas."""

    def __init__(
        self, weights: Mapping[str, float], caps: Mapping[str, int], mode: FairShareMode
    ) -> None:
        self.weights = dict(weights)
        self.caps = dict(caps)
        self.mode = mode
        self.virtual = 0.0
        self.finish: dict[str, float] = {}
        self.start: dict[int, float] = {}
        self.in_flight: Counter[str] = Counter()

    def tag(self, principal: str) -> float:
        if self.mode == "none":
            return 0.0
        start = max(self.virtual, self.finish.get(principal, self.virtual))
        self.finish[principal] = start + 1.0 / self.weights.get(principal, 1.0)
        return start

    def eligible(self, principal: str) -> bool:
        cap = self.caps.get(principal)
        return cap is None or self.in_flight[principal] < cap


class FairQueueMachine(RuleBasedStateMachine):
    """Several queues on one book; pushes, dispatches, discards, releases and live reweighs."""

    @initialize(weights=WEIGHTS, caps=CAPS, mode=MODES)
    def setup(self, weights, caps, mode):
        self.book = PrincipalBook(weights=weights, caps=caps, mode=mode)
        self.queues = [FairQueue(self.book, f"g{i}") for i in range(3)]
        self.model = Model(weights, caps, mode)
        self.pending: dict[int, list[PendingRequest]] = {i: [] for i in range(3)}
        self.leases: list[str] = []
        self.ids = itertools.count(1)
        self.served: list[PendingRequest] = []

    def expected_head(self, index: int) -> PendingRequest | None:
        model = self.model
        eligible = [r for r in self.pending[index] if model.eligible(r.principal)]
        return min(eligible, key=lambda r: (model.start[r.request_id], r.request_id), default=None)

    @rule(index=st.integers(0, 2), principal=st.sampled_from(PRINCIPALS), n=st.integers(1, 4))
    def push(self, index, principal, n):
        for _ in range(n):
            request = PendingRequest(next(self.ids), f"g{index}", False, 0.0)
            self.queues[index].push(request, principal)
            self.model.start[request.request_id] = self.model.tag(principal)
            self.pending[index].append(request)

    @rule(index=st.integers(0, 2))
    def dispatch(self, index):
        queue = self.queues[index]
        expected = self.expected_head(index)
        head = queue.head()
        assert head is expected
        if head is None:
            return
        mine = [r for r in self.pending[index] if r.principal == head.principal]
        assert head is mine[0]  # oldest first within its principal
        queue.take(head)
        self.book.acquire(head.principal)
        assert head.queue is None
        self.pending[index].remove(head)
        self.model.virtual = max(self.model.virtual, self.model.start[head.request_id])
        self.model.in_flight[head.principal] += 1
        self.leases.append(head.principal)
        self.served.append(head)

    @rule(principal=st.sampled_from(PRINCIPALS))
    def lease_at_once(self, principal):
        """A lease taken without queueing (a free slot at submit) counts toward the cap."""
        self.book.acquire(principal)
        self.model.in_flight[principal] += 1
        self.leases.append(principal)

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def release(self, data):
        principal = self.leases.pop(data.draw(st.integers(0, len(self.leases) - 1)))
        self.model.in_flight[principal] -= 1
        restored = self.book.release(principal)
        if not self.model.eligible(principal):
            assert restored == ()
        assert all(q in self.queues for q in restored)

    @precondition(lambda self: any(self.pending.values()))
    @rule(data=st.data())
    def discard(self, data):
        index = data.draw(st.sampled_from([i for i in range(3) if self.pending[i]]))
        request = data.draw(st.sampled_from(self.pending[index]))
        self.queues[index].discard(request)
        self.pending[index].remove(request)

    @rule(weights=WEIGHTS, caps=CAPS, mode=MODES)
    def reweigh(self, weights, caps, mode):
        model = self.model
        before = {i: list(q) for i, q in enumerate(self.queues)}
        ready = self.book.reweigh(self.queues, weights=weights, caps=caps, mode=mode)
        assert ready == [q for i, q in enumerate(self.queues) if self.pending[i]]
        if mode != model.mode or weights != model.weights:
            model.mode, model.weights = mode, dict(weights)
            model.finish.clear()
            for request in sorted(
                itertools.chain(*self.pending.values()), key=lambda r: r.request_id
            ):
                model.start[request.request_id] = model.tag(request.principal)
        model.caps = dict(caps)
        for i, queue in enumerate(self.queues):
            assert set(map(id, queue)) == set(map(id, before[i]))  # same objects, none lost

    @invariant()
    def heads_are_the_smallest_eligible_keys(self):
        for index, queue in enumerate(self.queues):
            assert queue.head() is self.expected_head(index)

    @invariant()
    def nothing_lost_or_duplicated(self):
        for index, queue in enumerate(self.queues):
            listed = list(queue)
            assert len(listed) == len(queue) == queue.live == len(self.pending[index])
            assert {id(r) for r in listed} == {id(r) for r in self.pending[index]}
            assert all(r.queue is queue for r in listed)
        queued = Counter(r.principal for q in self.pending.values() for r in q)
        for principal in PRINCIPALS:
            assert self.book.queued(principal) == queued[principal]
            assert self.book.in_flight(principal) == self.model.in_flight[principal]

    @invariant()
    def tags_follow_the_formulas(self):
        model = self.model
        assert self.book.virtual_time == model.virtual
        for queue in self.queues:
            for request in queue:
                assert request.start == model.start[request.request_id]

    @invariant()
    def fifo_within_each_principal(self):
        for queue in self.queues:
            for principal in PRINCIPALS:
                ids = [r.request_id for r in queue if r.principal == principal]
                assert ids == sorted(ids)


# Inherits the loaded profile (derandomized "ci" by default); sized to run in a few seconds.
FairQueueMachine.TestCase.settings = settings(max_examples=120, stateful_step_count=60)
TestFairQueueMachine = FairQueueMachine.TestCase
