"""Property tests of fair sharing in the pure scheduler (SPEC §5.2): principals, weights and caps.

A Hypothesis state machine drives a :class:`PoolScheduler` with three providers (``p``, ``q``,
``r``) and two model groups sharing ``q`` (``g0 = p, q``; ``g1 = q, r``), general and
long-context requests of three principals, and random fair-sharing knobs: weights (0.5..4),
caps (``max_in_flight``, none or 1..3), ``max_queued`` and the ``fair_share`` mode, swapped
live. Rules submit (one request, a burst, or one of a principal at its cap), release held
leases (any, a few, or one of a principal at its cap with requests waiting; default outcome, so
health stays out of it and ``fail()`` is never called), cancel a pending request, advance the
clock (expiring what is due) and apply a new policy. The model keeps only what the public API
shows: the leases it was handed (per principal and per provider) and the requests still
pending. Checked at every step:

1. caps: a dispatch never takes a principal past its ``max_in_flight`` (leases it holds from
   Dispatch decisions, minus releases). A cap lowered live evicts nothing, so the check is made
   on each dispatch, against the cap in force;
2. work conserving: no pending request whose principal is under its cap has a free slot of its
   kind on a provider of its group; a request refused at submit could not have started;
3. within a principal and one (group, kind) queue, the oldest request is dispatched first;
4. nothing is lost: every submitted request is dispatched, rejected (for a reason that holds)
   or still pending, and ``statistics()`` agrees (``submitted == admitted + rejected +
   queue_depth``, per-provider slot counts);
5. with ``fair_share: none`` and no caps, a queue is served in arrival order across principals.

Also, per queue, a dispatch takes the eligible request with the smallest ``(start, request_id)``
(the start-time fair-queuing order the scheduler advertises).

A separate property test saturates one slot with two weighted principals and checks that the
freed slot goes to each in proportion to its weight.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from iop_edge.pool import (
    Decision,
    Dispatch,
    PendingRequest,
    PoolPolicy,
    PoolScheduler,
    Rejection,
    RequestState,
    SlotLease,
)
from tests.helpers.pool import pool, provider

PRINCIPALS = ["a", "b", "c"]
GROUPS = {"g0": ["p", "q"], "g1": ["q", "r"]}  # q serves both groups
MODES = ["principal", "token", "none"]
KIND = st.sampled_from([False, False, False, True])  # long_context, mostly general
CAPS = st.sampled_from([None, 1, 1, 2, 3])  # max_in_flight, mostly set (and low)


@st.composite
def base_policies(draw: st.DrawFn) -> PoolPolicy:
    """The providers, groups and queue limits (fixed for a run); no fair-sharing knobs yet."""
    providers = []
    for pid in ("p", "q", "r"):
        capacity = draw(st.integers(1, 2))
        providers.append(provider(pid, capacity=capacity, long=draw(st.integers(0, capacity))))
    return pool(
        providers,
        {group: list(pids) for group, pids in GROUPS.items()},
        queue_timeout_ms=draw(st.sampled_from([0, 1000, 2000])),
        max_queue=draw(st.integers(4, 12)),
    )


@st.composite
def shared(draw: st.DrawFn, base: PoolPolicy) -> PoolPolicy:
    """``base`` with random weights (0.5..4), caps (none or 1..3), max_queued and mode."""
    weights = {
        who: w for who in PRINCIPALS if (w := draw(st.none() | st.floats(0.5, 4.0))) is not None
    }
    caps = {who: c for who in PRINCIPALS if (c := draw(CAPS)) is not None}
    if draw(st.integers(0, 3)) == 0:
        caps = {}  # at times none at all (for the arrival-order check of mode none)
    queue_caps = {who: draw(st.integers(0, 3)) for who in draw(st.sets(st.sampled_from("bc")))}
    return dataclasses.replace(
        base,
        weights=weights,
        caps=caps,
        queue_caps=queue_caps,
        fair_share=draw(st.sampled_from(MODES)),
    )


@st.composite
def policies(draw: st.DrawFn) -> PoolPolicy:
    return draw(shared(draw(base_policies())))


class SharingMachine(RuleBasedStateMachine):
    """Drives a :class:`PoolScheduler` with principals and checks fair sharing against a model."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.requests: list[PendingRequest] = []  # every submitted request
        self.pending: dict[int, PendingRequest] = {}  # by request_id, as the model sees it
        self.held: list[SlotLease] = []
        self.holding: Counter[str] = Counter()  # leases held per principal
        self.in_flight: Counter[str] = Counter()  # per provider id
        self.long_in_flight: Counter[str] = Counter()
        self.counts: Counter[str] = Counter()

    @initialize(policy=policies())
    def start(self, policy: PoolPolicy) -> None:
        self.policy = policy
        self.scheduler = PoolScheduler(policy)

    # -- the model ---------------------------------------------------------------------------

    def eligible(self, principal: str) -> bool:
        """Whether ``principal`` is under its cap (may take one more lease now)."""
        cap = self.policy.caps.get(principal)
        return cap is None or self.holding[principal] < cap

    def free(self, pid: str, long_context: bool) -> bool:
        """Whether provider ``pid`` has a free slot for a request of that kind."""
        p = next(p for p in self.policy.providers if p.provider_id == pid)
        return self.in_flight[pid] < p.capacity and (
            not long_context or self.long_in_flight[pid] < p.long_context_capacity
        )

    def rivals(self, request: PendingRequest) -> list[PendingRequest]:
        """The other pending requests of its queue (same group and kind)."""
        return [
            r
            for r in self.pending.values()
            if r is not request
            and r.group_id == request.group_id
            and r.long_context == request.long_context
        ]

    def could_start(self, request: PendingRequest) -> bool:
        """Whether a new request may be dispatched at once: its principal is under its cap, no
        eligible request of its queue waits, and a provider of its group has a free slot."""
        return (
            self.eligible(request.principal)
            and not any(self.eligible(r.principal) for r in self.rivals(request))
            and any(self.free(pid, request.long_context) for pid in GROUPS[request.group_id])
        )

    def deadline(self, request: PendingRequest) -> float | None:
        timeout = self.policy.queue_timeout_ms
        return request.submitted_at + timeout / 1000.0 if timeout else None

    # -- checking decisions ------------------------------------------------------------------

    def settle(
        self, decisions: list[Decision], kind: str, subject: PendingRequest | None = None
    ) -> None:
        """Check ``decisions`` (in the order they were taken) and apply them to the model."""
        for decision in decisions:
            request = decision.request
            queued = self.pending.pop(request.request_id, None)
            new = kind == "submit" and request is subject
            assert queued is request or (new and queued is None), f"{decision}: not pending"
            if isinstance(decision, Dispatch):
                self.check_dispatch(decision, queued=not new)
            else:
                self.check_rejection(decision, kind, subject, new)
        if kind == "submit":
            assert subject is not None
            if subject.state is RequestState.PENDING:
                assert subject.request_id not in self.pending
                self.pending[subject.request_id] = subject

    def check_dispatch(self, decision: Dispatch, *, queued: bool) -> None:
        request, lease = decision.request, decision.lease
        who, pid = request.principal, lease.provider_id
        assert request.state is RequestState.DISPATCHED
        assert request.lease is lease
        assert lease.request is request
        assert pid in GROUPS[request.group_id]
        assert self.free(pid, request.long_context), f"{lease} onto a full slot"
        # 1. A dispatch never takes a principal past its max_in_flight.
        assert self.eligible(who), f"{request} of {who} dispatched at its cap"
        rivals = self.rivals(request)
        # 3. Oldest first within a principal (same group and kind).
        older = [r for r in rivals if r.principal == who and r.request_id < request.request_id]
        assert not older, f"{request} of {who} overtook its own {older}"
        # 5. Mode none without caps: one FIFO across principals.
        if self.policy.fair_share == "none" and not self.policy.caps:
            older = [r for r in rivals if r.request_id < request.request_id]
            assert not older, f"mode none: {request} overtook {older}"
        # The fair order: the eligible request with the smallest (start, request_id) goes first
        # (a new request starts at once only when no eligible one of its queue waits).
        key = (request.start, request.request_id)
        ahead = [
            r
            for r in rivals
            if self.eligible(r.principal) and (not queued or (r.start, r.request_id) < key)
        ]
        assert not ahead, f"{request} of {who} (key {key}) went before {ahead}"
        self.held.append(lease)
        self.holding[who] += 1
        self.in_flight[pid] += 1
        self.long_in_flight[pid] += request.long_context
        self.counts["admitted"] += 1

    def check_rejection(
        self, decision: Rejection, kind: str, subject: PendingRequest | None, new: bool
    ) -> None:
        request, reason = decision.request, decision.reason.value
        assert request.state is RequestState.REJECTED
        assert request.rejection is decision
        assert not decision.config_change  # groups and providers never change here
        if new:
            # Refused at submit: it could not have started (work conservation at the door).
            assert not self.could_start(request), f"{request} refused beside a free slot"
        if reason == "queue_timeout":
            deadline = self.deadline(request)
            assert not new
            assert deadline is not None
            assert self.now >= deadline
        elif reason == "client_gone":
            assert kind == "cancel"
            assert request is subject
        elif reason == "queue_full":
            assert new
            assert len(self.pending) >= self.policy.max_queue
        else:
            assert reason == "principal_queue_full", reason
            assert new
            mine = sum(r.principal == request.principal for r in self.pending.values())
            assert mine >= self.policy.queue_caps[request.principal]
        self.counts[reason] += 1

    # -- rules -------------------------------------------------------------------------------

    @rule(who=st.sampled_from(PRINCIPALS), group=st.sampled_from(list(GROUPS)), long=KIND)
    def submit(self, who: str, group: str, long: bool) -> None:
        submission = self.scheduler.submit(group, long_context=long, now=self.now, principal=who)
        request = submission.request
        assert request.principal == who
        assert all(request.request_id > r.request_id for r in self.requests)
        self.requests.append(request)
        self.counts["submitted"] += 1
        self.settle(submission.decisions, "submit", request)

    @rule(
        batch=st.lists(
            st.tuples(st.sampled_from(PRINCIPALS), st.sampled_from(list(GROUPS)), KIND),
            min_size=2,
            max_size=4,
        )
    )
    def submit_burst(self, batch: list[tuple[str, str, bool]]) -> None:
        for who, group, long in batch:
            self.submit(who, group, long)

    @precondition(lambda self: any(not self.eligible(who) for who in PRINCIPALS))
    @rule(data=st.data(), group=st.sampled_from(list(GROUPS)), long=KIND)
    def submit_at_cap(self, data: st.DataObject, group: str, long: bool) -> None:
        """A principal at its cap asks again: it must wait (skipped, not refused) and be
        served once it is under its cap."""
        capped = [who for who in PRINCIPALS if not self.eligible(who)]
        self.submit(data.draw(st.sampled_from(capped)), group, long)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), count=st.sampled_from([1, 1, 2, 4]))
    def release(self, data: st.DataObject, count: int) -> None:
        for _ in range(min(count, len(self.held))):
            self.release_one(data.draw(st.sampled_from(self.held)))

    @precondition(lambda self: self.capped_leases())
    @rule(data=st.data())
    def release_at_cap(self, data: st.DataObject) -> None:
        """A lease comes back to a principal at its cap with requests waiting: they compete
        again, for its freed slot and for any other free one of their groups."""
        self.release_one(data.draw(st.sampled_from(self.capped_leases())))

    def capped_leases(self) -> list[SlotLease]:
        waiting = {r.principal for r in self.pending.values() if not self.eligible(r.principal)}
        return [lease for lease in self.held if lease.request.principal in waiting]

    def release_one(self, lease: SlotLease) -> None:
        self.held.remove(lease)
        self.holding[lease.request.principal] -= 1
        self.in_flight[lease.provider_id] -= 1
        self.long_in_flight[lease.provider_id] -= lease.long_context
        self.counts["released"] += 1
        decisions = self.scheduler.release(lease, self.now)
        assert lease.released
        self.settle(decisions, "release")

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        request = data.draw(st.sampled_from(list(self.pending.values())))
        self.settle(self.scheduler.cancel(request, self.now), "cancel", request)
        assert request.state is RequestState.REJECTED
        assert request.request_id not in self.pending

    @rule(dt=st.sampled_from([0.125, 0.25, 0.5, 1.0]))
    def advance(self, dt: float) -> None:
        self.now += dt
        self.settle(self.scheduler.expire(self.now), "advance")

    @rule(data=st.data())
    def apply_policy(self, data: st.DataObject) -> None:
        self.policy = data.draw(shared(self.policy))
        self.settle(self.scheduler.apply_policy(self.policy, self.now), "apply")

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def work_conserving(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        for request in self.pending.values():
            if self.eligible(request.principal):
                free = [p for p in GROUPS[request.group_id] if self.free(p, request.long_context)]
                assert not free, f"{request} of {request.principal} waits beside free {free}"

    @invariant()
    def nothing_lost(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        states = Counter(r.state for r in self.requests)
        pending = {r.request_id for r in self.requests if r.state is RequestState.PENDING}
        assert pending == set(self.pending)
        for request in self.pending.values():
            assert request.lease is None
            deadline = self.deadline(request)
            assert deadline is None or deadline > self.now, f"{request} outlived its deadline"
        stats = self.scheduler.statistics()
        assert stats.submitted == self.counts["submitted"] == len(self.requests)
        assert stats.admitted == self.counts["admitted"] == states[RequestState.DISPATCHED]
        assert stats.rejected_total == states[RequestState.REJECTED]
        assert {k: v for k, v in stats.rejected.items() if v} == {
            k: v for k, v in self.counts.items() if k not in ("submitted", "admitted", "released")
        }
        assert stats.queue_depth == self.scheduler.queue_depth == len(self.pending)
        assert stats.submitted == stats.admitted + stats.rejected_total + stats.queue_depth
        assert stats.released == self.counts["released"]
        shown = {p.provider_id: (p.in_flight, p.long_in_flight) for p in stats.providers}
        assert shown == {pid: (self.in_flight[pid], self.long_in_flight[pid]) for pid in "pqr"}
        assert sum(self.holding.values()) == len(self.held) == stats.in_flight
        for lease in self.held:
            assert not lease.released
            assert lease.request.lease is lease


# Inherits the loaded profile (derandomized "ci" by default); sized to run in a few seconds.
SharingMachine.TestCase.settings = settings(max_examples=250, stateful_step_count=60)
TestSharingMachine = SharingMachine.TestCase


# -- shares under saturation -----------------------------------------------------------------

ROUNDS = 400
BACKLOG = 20
TOLERANCE = 0.05


@settings(max_examples=100)
@given(
    w_a=st.floats(1.0, 4.0),
    w_b=st.floats(1.0, 4.0),
    mode=st.sampled_from(["principal", "token"]),
    first=st.sampled_from("ab"),
    arrivals=st.permutations(["a"] * BACKLOG + ["b"] * BACKLOG),
)
@example(w_a=1.0, w_b=3.0, mode="principal", first="a", arrivals=["a", "b"] * BACKLOG)
def test_a_saturated_slot_goes_to_each_principal_by_weight(
    w_a: float, w_b: float, mode: str, first: str, arrivals: list[str]
) -> None:
    """One slot, principals a and b each with >= 20 requests queued at all times: over 400
    dispatches b gets ``w_b / (w_a + w_b)`` of the slot (3/4 for weights 1 and 3), ± 0.05."""
    policy = dataclasses.replace(
        pool([provider("p", capacity=1)], max_queue=1000),
        weights={"a": w_a, "b": w_b},
        fair_share=mode,  # type: ignore[arg-type]
    )
    scheduler = PoolScheduler(policy)
    lease = scheduler.submit("m", now=0.0, principal=first).request.lease
    assert lease is not None
    for who in arrivals:
        assert scheduler.submit("m", now=0.0, principal=who).request.lease is None
    served: Counter[str] = Counter()
    for round_ in range(1, ROUNDS + 1):
        now = round_ / 8  # binary fractions: exact, and no wall clock
        (dispatch,) = scheduler.release(lease, now)
        assert isinstance(dispatch, Dispatch)
        who = dispatch.request.principal
        served[who] += 1
        # Keep both backlogged: the principal just served queues one more.
        assert scheduler.submit("m", now=now, principal=who).request.lease is None
        assert scheduler.queue_depth == 2 * BACKLOG
        lease = dispatch.lease
    assert served.total() == ROUNDS
    share = served["b"] / ROUNDS
    expected = w_b / (w_a + w_b)
    assert abs(share - expected) <= TOLERANCE, (dict(served), expected)
