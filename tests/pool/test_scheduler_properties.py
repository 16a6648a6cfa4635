"""Property tests of the pure scheduler: a Hypothesis state machine against a simple model.

Rules submit, release (once or twice), cancel, advance time and swap in random policies. The
model keeps only what SPEC §5 and §4 talk about (slot counts per provider, each request's fate,
the policy in force) and every step checks the invariants:

- capacity and long-context slots are never exceeded by a dispatch;
- every request ends exactly once (admitted, rejected or expired), and a reason is only given
  when it is true;
- a new dispatch goes to a candidate with the lowest (in_flight, priority);
- oldest first: no request still pending is older than one that took a slot it could have used;
- work conserving: no pending request has a free slot it could use;
- nothing is admitted at or after its deadline, nothing pending is past its deadline;
- ``statistics()`` agrees with the requests' fates and the model's slot counts.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from iop_edge.pool import (
    REJECTION_COUNTERS,
    Decision,
    Dispatch,
    PendingRequest,
    PoolPolicy,
    PoolScheduler,
    ProviderKey,
    ProviderPolicy,
    Rejection,
    RequestState,
    SlotLease,
)

KEYS: list[ProviderKey] = [("n1", "a"), ("n1", "b"), ("n2", "c"), ("n2", "d")]
GROUPS = ["g0", "g1", "g2"]


@st.composite
def provider_policies(draw: st.DrawFn, key: ProviderKey) -> ProviderPolicy:
    capacity = draw(st.integers(1, 3))
    return ProviderPolicy(
        node_id=key[0],
        provider_id=key[1],
        capacity=capacity,
        long_context_capacity=draw(st.integers(0, capacity)),
        priority=draw(st.integers(0, 2)),
        enabled=draw(st.sampled_from([True, True, True, False])),
    )


@st.composite
def pool_policies(draw: st.DrawFn) -> PoolPolicy:
    """Random policies that keep enough contention to be interesting.

    Providers a and b and groups g0 and g1 (non-empty) are always there; c, d and g2 come and
    go, and g2 may be empty, so removals and "no enabled provider" happen too.
    """
    providers = tuple(
        draw(provider_policies(key)) for i, key in enumerate(KEYS) if i < 2 or draw(st.booleans())
    )
    keys = [p.key for p in providers]
    groups = {
        group_id: tuple(draw(st.lists(st.sampled_from(keys), unique=True, min_size=1)))
        for group_id in GROUPS[:2]
    }
    if draw(st.booleans()):
        groups["g2"] = tuple(draw(st.lists(st.sampled_from(keys), unique=True)))
    return PoolPolicy(
        max_queue=draw(st.integers(1, 4)),
        queue_timeout_ms=draw(st.sampled_from([1000, 0, 500, 2500])),
        providers=providers,
        groups=groups,
    )


@dataclass
class Fate:
    """What the model knows about one request."""

    request: PendingRequest
    outcome: str | None = None  # "admitted" or a rejection counter key


@dataclass
class Step:
    """The operation being checked, for reason checks."""

    kind: str
    subject: PendingRequest | None = None
    dispatches: list[tuple[PendingRequest, ProviderKey]] = field(default_factory=list)


class SchedulerMachine(RuleBasedStateMachine):
    """Drives a :class:`PoolScheduler` and a model side by side."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.fates: dict[int, Fate] = {}
        self.held: list[SlotLease] = []
        self.released: list[SlotLease] = []
        self.in_flight: Counter[ProviderKey] = Counter()
        self.long_in_flight: Counter[ProviderKey] = Counter()
        self.counts: Counter[str] = Counter()

    @initialize(policy=pool_policies())
    def start(self, policy: PoolPolicy) -> None:
        self.policy = policy
        self.scheduler = PoolScheduler(policy)

    # -- model helpers ----------------------------------------------------------------------

    def provider(self, key: ProviderKey) -> ProviderPolicy | None:
        return next((p for p in self.policy.providers if p.key == key), None)

    def grouped_provider(self, key: ProviderKey) -> ProviderPolicy:
        """The policy of a provider a group lists (a PoolPolicy refuses unknown references)."""
        found = self.provider(key)
        assert found is not None
        return found

    def free_for(self, key: ProviderKey, long_context: bool) -> bool:
        p = self.provider(key)
        return (
            p is not None
            and p.enabled
            and self.in_flight[key] < p.capacity
            and (not long_context or self.long_in_flight[key] < p.long_context_capacity)
        )

    def candidates(self, request: PendingRequest) -> list[ProviderKey]:
        members = self.policy.groups.get(request.group_id, ())
        return [k for k in members if self.free_for(k, request.long_context)]

    def deadline(self, request: PendingRequest) -> float | None:
        timeout = self.policy.queue_timeout_ms
        return request.submitted_at + timeout / 1000.0 if timeout else None

    def pending(self) -> list[PendingRequest]:
        return [f.request for f in self.fates.values() if f.outcome is None]

    # -- checking one operation ------------------------------------------------------------

    def settle(self, decisions: list[Decision], step: Step) -> None:
        for decision in decisions:
            fate = self.fates[decision.request.request_id]
            assert fate.outcome is None, f"{decision} for a request that already ended"
            if isinstance(decision, Dispatch):
                self.check_dispatch(decision, step)
                fate.outcome = "admitted"
            else:
                self.check_rejection(decision, step)
                fate.outcome = "config_change" if decision.config_change else decision.reason.value
            self.counts[fate.outcome] += 1
        self.check_oldest_first(step)

    def check_dispatch(self, decision: Dispatch, step: Step) -> None:
        request, lease = decision.request, decision.lease
        key = lease.key
        assert request.state is RequestState.DISPATCHED
        assert request.lease is lease
        assert key in self.policy.groups[request.group_id]
        assert self.free_for(key, request.long_context), "dispatch onto a full or disabled slot"
        deadline = self.deadline(request)
        assert deadline is None or self.now < deadline, "admitted at or after its deadline"
        if step.kind in ("submit", "apply"):
            # A new choice (not a freed slot handed on): lowest in_flight, then priority.
            def rank(k: ProviderKey) -> tuple[int, int]:
                p = self.provider(k)
                assert p is not None
                return (self.in_flight[k], p.priority)

            best = min(rank(k) for k in self.candidates(request))
            assert rank(key) == best, f"{key} chosen, a candidate ranked {best} was free"
        self.in_flight[key] += 1
        self.long_in_flight[key] += request.long_context
        assert lease.long_context == request.long_context
        self.held.append(lease)
        step.dispatches.append((request, key))

    def check_rejection(self, decision: Rejection, step: Step) -> None:
        request, reason = decision.request, decision.reason.value
        assert request.state is RequestState.REJECTED
        assert request.rejection is decision
        group = self.policy.groups.get(request.group_id)
        if decision.config_change:
            assert step.kind == "apply"
            assert request is not step.subject
        if reason == "model_not_found":
            assert group is None
        elif reason == "no_available_provider":
            assert group is not None
            assert not any(self.grouped_provider(k).enabled for k in group)
        elif reason == "queue_full":
            assert step.kind == "submit"
            assert request is step.subject
            assert len(self.pending()) - 1 >= self.policy.max_queue
            assert not self.candidates(request)
        elif reason == "queue_timeout":
            deadline = self.deadline(request)
            assert deadline is not None
            assert self.now >= deadline
        else:
            assert reason == "client_gone"
            assert step.kind == "cancel"
            assert request is step.subject

    def check_oldest_first(self, step: Step) -> None:
        for waiting in self.pending():
            members = self.policy.groups.get(waiting.group_id, ())
            for taker, key in step.dispatches:
                if taker.request_id < waiting.request_id or key not in members:
                    continue
                p = self.provider(key)
                assert p is not None
                # The taker was younger and took a general slot on a provider of the waiting
                # request's group: fine only if that request needed a long slot that was full.
                # (Long slots only fill up while an operation dispatches.)
                could_serve = not waiting.long_context or (
                    taker.long_context or self.long_in_flight[key] < p.long_context_capacity
                )
                assert not could_serve, f"{taker} overtook older {waiting} on {key}"

    # -- rules ----------------------------------------------------------------------------

    @rule(group=st.sampled_from([*GROUPS, "unknown"]), long_context=st.booleans())
    def submit(self, group: str, long_context: bool) -> None:
        submission = self.scheduler.submit(group, long_context=long_context, now=self.now)
        request = submission.request
        assert request.request_id not in self.fates
        assert request.submitted_at == self.now
        self.fates[request.request_id] = Fate(request)
        self.counts["submitted"] += 1
        self.settle(submission.decisions, Step("submit", request))

    @rule(
        groups=st.lists(st.sampled_from(GROUPS), min_size=2, max_size=5),
        long_context=st.booleans(),
    )
    def submit_burst(self, groups: list[str], long_context: bool) -> None:
        for group in groups:
            self.submit(group, long_context)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        lease = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        self.in_flight[lease.key] -= 1
        self.long_in_flight[lease.key] -= lease.long_context
        self.released.append(lease)
        self.counts["released"] += 1
        self.settle(self.scheduler.release(lease, self.now), Step("release"))

    @precondition(lambda self: self.released)
    @rule(data=st.data())
    def release_again(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(self.released))
        assert self.scheduler.release(lease, self.now) == []
        self.counts["double_releases"] += 1

    @precondition(lambda self: self.fates)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        fate = data.draw(st.sampled_from(list(self.fates.values())))
        self.settle(self.scheduler.cancel(fate.request, self.now), Step("cancel", fate.request))

    @rule(dt=st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.5]))
    def advance(self, dt: float) -> None:
        self.now += dt
        self.settle(self.scheduler.expire(self.now), Step("expire"))

    @rule(policy=pool_policies())
    def apply_policy(self, policy: PoolPolicy) -> None:
        self.policy = policy
        self.settle(self.scheduler.apply_policy(policy, self.now), Step("apply"))

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def pending_requests_are_pending_and_not_past_their_deadline(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        for request in self.pending():
            assert request.state is RequestState.PENDING
            deadline = self.deadline(request)
            assert request.deadline == deadline
            assert deadline is None or self.now < deadline
        deadlines = [r.deadline for r in self.pending() if r.deadline is not None]
        next_deadline = self.scheduler.next_deadline()
        assert next_deadline == (min(deadlines) if deadlines else None)

    @invariant()
    def work_conserving(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        for request in self.pending():
            assert not self.candidates(request), f"{request} waits beside a free slot"

    @invariant()
    def statistics_agree_with_the_fates(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        stats = self.scheduler.statistics()
        assert stats.submitted == self.counts["submitted"] == len(self.fates)
        assert stats.admitted == self.counts["admitted"]
        assert dict(stats.rejected) == {key: self.counts[key] for key in REJECTION_COUNTERS}
        assert stats.expired == self.counts["queue_timeout"]
        assert stats.queue_depth == len(self.pending())
        assert stats.released == self.counts["released"]
        assert stats.double_releases == self.counts["double_releases"]
        assert stats.submitted == stats.admitted + stats.rejected_total + stats.queue_depth
        shown = {(p.node_id, p.provider_id): p for p in stats.providers}
        assert len(shown) == len(stats.providers)
        for key in KEYS:
            policy = self.provider(key)
            if policy is None and not self.in_flight[key]:
                assert key not in shown
                continue
            p = shown[key]
            assert (p.in_flight, p.long_in_flight) == (
                self.in_flight[key],
                self.long_in_flight[key],
            )
            if policy is None:
                assert (p.status, p.enabled, p.capacity) == ("removed", False, 0)
            elif policy.enabled:
                assert (p.status, p.health) == ("active", "unknown")
                assert (p.capacity, p.long_context_capacity, p.priority) == (
                    policy.capacity,
                    policy.long_context_capacity,
                    policy.priority,
                )
            else:
                assert (p.status, p.health, p.capacity) == ("disabled", "disabled", 0)


# Inherits the loaded profile (derandomized "ci" by default); sized to run in a few seconds.
SchedulerMachine.TestCase.settings = settings(max_examples=120, stateful_step_count=40)
TestSchedulerMachine = SchedulerMachine.TestCase
