"""Property tests of the pure scheduler: a Hypothesis state machine against a simple model.

Rules submit, release (once or twice, with every kind of outcome), fail over, cancel, deliver
probe results, advance time (by steps, or to the next timer the scheduler asks for), swap in
random policies (health policy, ``max_attempts`` and probe capability included) and bring the
node links of remote nodes up and down (a remote provider is a candidate only while its link is
up; its health starts over when the link goes down and when it is back). The model
keeps what SPEC §5, §5.1 and §4 talk about (slot counts per provider, each request's fate and
the providers it tried, the policy in force, each provider's consecutive failures and trial);
provider health states are read from ``statistics()`` and each change is checked against the
operation that caused it. Every step checks the invariants:

- capacity and long-context slots are never exceeded by a dispatch;
- every request ends exactly once (admitted, rejected or expired) — or re-enters admission
  after a failed attempt — and a reason is only given when it is true;
- a new dispatch goes to a candidate with the lowest (in_flight, priority);
- oldest first: no request still pending is older than one that took a slot it could have used,
  and a request failing over is served before every queued one;
- work conserving: no pending request (queued or failing over) has a free slot on a provider
  that health lets it use;
- an ejected or held provider gets a lease only while its model group is in panic; a half-open
  provider has at most one trial lease; a group is in panic exactly when all its members are out;
- a retried request never goes to a provider it already tried, and every lease is released
  exactly once across retries;
- nothing is admitted at or after its deadline (a retry that need not wait aside), nothing
  pending is past its deadline, and a deadline is always ``submitted_at + queue_timeout``;
- ejections happen after ``failure_threshold`` consecutive failures (or one while half-open)
  and last ``eject_ms`` doubled per re-ejection up to ``max_eject_ms``; no health timer is
  missed and ``next_event()`` is never later than the nearest one;
- ``statistics()`` agrees with the requests' fates and the model's slot counts, and
  ``submitted + failovers == admitted + rejected + queue_depth``;
- a disconnected provider gets no lease, takes no part in a panic, is not waited for by a
  request failing over, has no health timer or probe and reads ``disconnected``; each change
  of a link gives each enabled remote provider of its node one ``connected`` or
  ``disconnected`` event, and no other operation does.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field

import pytest
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
    OK,
    PROBE,
    REJECTION_COUNTERS,
    RETRY_CLASSES,
    Decision,
    Dispatch,
    Failure,
    HealthEvent,
    HealthPolicy,
    Notice,
    Outcome,
    PendingRequest,
    PoolPolicy,
    PoolScheduler,
    PoolStatistics,
    ProviderKey,
    ProviderPolicy,
    ProviderStatistics,
    Rejection,
    RequestState,
    SlotLease,
    may_retry,
)

KEYS: list[ProviderKey] = [("n1", "a"), ("n1", "b"), ("n2", "c"), ("n2", "d")]
GROUPS = ["g0", "g1", "g2"]
NODES = ["n1", "n2"]
REMOTE_NODES = [frozenset({"n2"}), frozenset({"n1"}), frozenset(NODES), frozenset()]
"""Which nodes are remote, for one run (fixed, as for a running edge: a restart-class field)."""

FAILURES = [
    Failure("connect", "connection refused"),
    Failure("dropped", "the connection dropped before the response head"),
    Failure("timeout", "no response head in time"),
    Failure("status_5xx", "the provider answered 503"),
    Failure("exit", "the command exited 1"),
    Failure("protocol", "a broken answer"),
    Failure("status_429", "the provider answered 429"),
    Failure("status_429", "the provider answered 429", retry_after=0.25),
    Failure("status_429", "the provider answered 429", retry_after=30.0),  # capped
]
OUTCOMES: list[Outcome] = [None, OK, OK, OK, OK, *FAILURES]


@st.composite
def provider_policies(
    draw: st.DrawFn, key: ProviderKey, remote: frozenset[str] = frozenset()
) -> ProviderPolicy:
    capacity = draw(st.integers(1, 2))
    return ProviderPolicy(
        node_id=key[0],
        provider_id=key[1],
        capacity=capacity,
        long_context_capacity=draw(st.integers(0, capacity)),
        priority=draw(st.integers(0, 2)),
        enabled=draw(st.sampled_from([True, True, True, False])),
        probe=draw(st.booleans()),
        retry_on=draw(
            st.one_of(
                st.just(frozenset(RETRY_CLASSES)), st.frozensets(st.sampled_from(RETRY_CLASSES))
            )
        ),
        remote=key[0] in remote,
    )


@st.composite
def health_policies(draw: st.DrawFn) -> HealthPolicy:
    eject_ms = draw(st.sampled_from([250, 500, 1000]))
    return HealthPolicy(
        failure_threshold=draw(st.sampled_from([1, 1, 2, 3])),
        eject_ms=eject_ms,
        max_eject_ms=eject_ms * draw(st.sampled_from([1, 2, 4])),
        probe_interval_ms=draw(st.sampled_from([125, 125, 250, 1500])),
    )


@st.composite
def pool_policies(draw: st.DrawFn, remote: frozenset[str] = frozenset()) -> PoolPolicy:
    """Random policies that keep enough contention to be interesting.

    Providers a and b and groups g0 and g1 (non-empty) are always there; c, d and g2 come and
    go, and g2 may be empty, so removals and "no enabled provider" happen too.
    """
    providers = tuple(
        draw(provider_policies(key, remote))
        for i, key in enumerate(KEYS)
        if i < 2 or draw(st.booleans())
    )
    keys = [p.key for p in providers]
    groups = {
        group_id: tuple(draw(st.lists(st.sampled_from(keys), unique=True, min_size=2 - i)))
        for i, group_id in enumerate(GROUPS[:2])
    }
    if draw(st.booleans()):
        groups["g2"] = tuple(draw(st.lists(st.sampled_from(keys), unique=True)))
    return PoolPolicy(
        max_queue=draw(st.integers(1, 4)),
        queue_timeout_ms=draw(st.sampled_from([1000, 0, 500, 2500])),
        providers=providers,
        groups=groups,
        max_attempts=draw(st.integers(1, 3)),
        health=draw(health_policies()),
    )


@st.composite
def tweaked_policies(
    draw: st.DrawFn, policy: PoolPolicy, remote: frozenset[str] = frozenset()
) -> PoolPolicy:
    """Mostly the policy in force with one provider or the live knobs changed (so health has
    time to build up across swaps), sometimes a new random one."""
    change = draw(st.sampled_from(["new", "provider", "provider", "knobs"]))
    if change == "new":
        return draw(pool_policies(remote))
    if change == "provider":
        index = draw(st.integers(0, len(policy.providers) - 1))
        providers = list(policy.providers)
        providers[index] = draw(provider_policies(providers[index].key, remote))
        return dataclasses.replace(policy, providers=tuple(providers), groups=dict(policy.groups))
    return dataclasses.replace(
        policy,
        groups=dict(policy.groups),
        max_queue=draw(st.integers(1, 4)),
        queue_timeout_ms=draw(st.sampled_from([1000, 0, 500, 2500])),
        max_attempts=draw(st.integers(1, 3)),
        health=draw(health_policies()),
    )


@dataclass
class Fate:
    """What the model knows about one request."""

    request: PendingRequest
    outcome: str | None = None  # "admitted" or a rejection counter key; None while pending


@dataclass
class Step:
    """The operation being checked, with the statistics just before it (for reason checks)."""

    kind: str
    subject: PendingRequest | None = None
    outcome: tuple[ProviderKey, Outcome] | None = None  # the lease's provider and its outcome
    probe: tuple[ProviderKey, bool] | None = None
    before: PoolStatistics | None = None
    # (request, provider, whether it was a retry) for each dispatch of the step, in order
    dispatches: list[tuple[PendingRequest, ProviderKey, bool]] = field(default_factory=list)
    retries_before: frozenset[int] = frozenset()  # request ids failing over before the step
    link: tuple[str, bool] | None = None  # a node link that came up (True) or went down
    link_changed: frozenset[ProviderKey] = frozenset()  # enabled providers it (dis)connected


class SchedulerMachine(RuleBasedStateMachine):
    """Drives a :class:`PoolScheduler` and a model side by side."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.fates: dict[int, Fate] = {}
        self.tried: dict[int, list[ProviderKey]] = {}  # providers each request got, in order
        self.held: list[SlotLease] = []
        self.released: list[SlotLease] = []
        self.in_flight: Counter[ProviderKey] = Counter()
        self.long_in_flight: Counter[ProviderKey] = Counter()
        self.counts: Counter[str] = Counter()
        # Health, per enabled provider (reset when it is enabled again).
        self.failures: Counter[ProviderKey] = Counter()  # consecutive failures
        self.run: Counter[ProviderKey] = Counter()  # ejections since a request succeeded
        # when each provider was last ejected, and whether the last success was stale (its
        # request granted before that ejection: it changes nothing)
        self.ejected_at: dict[ProviderKey, float] = {}
        self.stale_success = False
        self.ejections: Counter[ProviderKey] = Counter()
        self.probes_ok: Counter[ProviderKey] = Counter()
        self.probes_failed: Counter[ProviderKey] = Counter()
        self.probe_failed: set[ProviderKey] = set()  # a probe failed during this ejection
        self.trial: dict[ProviderKey, SlotLease] = {}  # the half-open trial lease
        self.probes: list[ProviderKey] = []  # probes asked for and not answered yet
        self.probe_sent: dict[ProviderKey, float] = {}  # when the running probe was asked for
        # Trust in probes: a probe ended the last ejection (and no request succeeded since);
        # distrusted: ejected again by requests after that, until a request succeeds.
        self.probe_recovered: set[ProviderKey] = set()
        self.distrusted: set[ProviderKey] = set()
        self.retry_on: dict[ProviderKey, frozenset[str]] = {}  # each provider's last rule
        self.panics: dict[str, bool] = {}
        self.remote_nodes: frozenset[str] = frozenset()
        self.up: set[str] = set()  # the remote nodes whose link is up

    @initialize(remote=st.sampled_from(REMOTE_NODES), data=st.data())
    def start(self, remote: frozenset[str], data: st.DataObject) -> None:
        self.remote_nodes = remote
        policy = data.draw(pool_policies(remote))
        self.policy = policy
        self.retry_on.update((p.key, p.retry_on) for p in policy.providers)
        self.scheduler = PoolScheduler(policy)
        self.stats = self.scheduler.statistics()
        self.panics = {g.group_id: g.panic for g in self.stats.groups}
        assert not any(self.panics.values())
        assert self.scheduler.take_events() == []

    # -- model helpers ----------------------------------------------------------------------

    def provider(self, key: ProviderKey) -> ProviderPolicy | None:
        return next((p for p in self.policy.providers if p.key == key), None)

    def grouped_provider(self, key: ProviderKey) -> ProviderPolicy:
        """The policy of a provider a group lists (a PoolPolicy refuses unknown references)."""
        found = self.provider(key)
        assert found is not None
        return found

    def enabled(self, key: ProviderKey) -> bool:
        p = self.provider(key)
        return p is not None and p.enabled

    def connected(self, key: ProviderKey) -> bool:
        """A local provider always is; a remote one while its node's link is up."""
        return key[0] not in self.remote_nodes or key[0] in self.up

    def free_for(self, key: ProviderKey, long_context: bool) -> bool:
        p = self.provider(key)
        return (
            p is not None
            and p.enabled
            and self.connected(key)
            and self.in_flight[key] < p.capacity
            and (not long_context or self.long_in_flight[key] < p.long_context_capacity)
        )

    @staticmethod
    def shown(stats: PoolStatistics, key: ProviderKey) -> ProviderStatistics | None:
        return next((p for p in stats.providers if (p.node_id, p.provider_id) == key), None)

    def out(self, stats: PoolStatistics, key: ProviderKey) -> bool:
        """Ejected or held (as ``stats`` shows it); only enabled providers are ever out."""
        p = self.shown(stats, key)
        return (
            p is not None
            and p.enabled
            and (p.ejected_until is not None or p.held_until is not None)
        )

    def half_open(self, stats: PoolStatistics, key: ProviderKey) -> bool:
        p = self.shown(stats, key)
        return p is not None and p.enabled and p.half_open

    @staticmethod
    def panic(stats: PoolStatistics, group_id: str) -> bool:
        return next((g.panic for g in stats.groups if g.group_id == group_id), False)

    def usable(self, key: ProviderKey, group_id: str) -> bool:
        """Whether health lets a new request of ``group_id`` go to ``key`` now."""
        stats = self.stats
        if self.panic(stats, group_id):
            return True
        return not self.out(stats, key) and not (self.half_open(stats, key) and key in self.trial)

    def candidates(self, request: PendingRequest) -> list[ProviderKey]:
        members = self.policy.groups.get(request.group_id, ())
        tried = self.tried.get(request.request_id, ())
        return [
            k
            for k in members
            if k not in tried
            and self.free_for(k, request.long_context)
            and self.usable(k, request.group_id)
        ]

    def untried_left(self, request: PendingRequest, stats: PoolStatistics) -> list[ProviderKey]:
        """The members a request failing over may still wait for (busy or not)."""
        group_id = request.group_id
        tried = self.tried.get(request.request_id, ())
        in_panic = self.panic(self.stats, group_id)
        return [
            k
            for k in self.policy.groups.get(group_id, ())
            if k not in tried
            and self.enabled(k)
            and self.connected(k)
            and (in_panic or not self.out(stats, k))
        ]

    def deadline(self, request: PendingRequest) -> float | None:
        timeout = self.policy.queue_timeout_ms
        return request.submitted_at + timeout / 1000.0 if timeout else None

    def pending(self) -> list[PendingRequest]:
        return [f.request for f in self.fates.values() if f.outcome is None]

    def failing_over(self) -> frozenset[int]:
        return frozenset(r.request_id for r in self.pending() if self.tried.get(r.request_id))

    # -- checking one operation ------------------------------------------------------------

    def begin(
        self,
        kind: str,
        subject: PendingRequest | None = None,
        *,
        outcome: tuple[ProviderKey, Outcome] | None = None,
        probe: tuple[ProviderKey, bool] | None = None,
    ) -> Step:
        """Start checking an operation: remember the statistics just before it."""
        return Step(
            kind,
            subject,
            outcome=outcome,
            probe=probe,
            before=self.stats,
            retries_before=self.failing_over(),
        )

    def finish(self, decisions: list[Decision], step: Step) -> None:
        """After an operation: check its health effects and events, then its decisions."""
        before = step.before
        assert before is not None
        self.stats = self.scheduler.statistics()
        for key in KEYS:
            p = self.shown(self.stats, key)
            gone = p is None or not p.enabled
            if gone or not self.connected(key):
                # Gone or disabled: it starts over when enabled again. Disconnected: its health
                # starts over, its counters since start carry on. Its probes still running
                # are dropped (the scheduler ignores their results while it is disabled or
                # disconnected; one landing after it is back would count on its new health).
                counters = [self.failures, self.run]
                if gone:
                    counters += [self.ejections, self.probes_ok, self.probes_failed]
                for counter in counters:
                    counter.pop(key, None)
                self.probe_failed.discard(key)
                self.ejected_at.pop(key, None)
                self.probes = [k for k in self.probes if k != key]
                self.probe_recovered.discard(key)
                self.distrusted.discard(key)
            if not self.half_open(self.stats, key):
                self.trial.pop(key, None)
        has_events = self.scheduler.has_events
        events = self.scheduler.take_events()
        assert has_events is bool(events)
        assert not self.scheduler.has_events
        self.check_events(events, step)
        self.settle(decisions, step)

    def check_events(self, events: list[Notice], step: Step) -> None:
        before, after = step.before, self.stats
        assert before is not None
        health = self.policy.health
        probe_failed = frozenset(self.probe_failed)  # as the ejections ending now find it
        seen: dict[ProviderKey, list[str]] = {}
        for subject, event in events:
            if isinstance(subject, str):
                assert isinstance(event, HealthEvent)
                assert event.kind in ("panic", "panic_over")
                assert subject in self.policy.groups
                assert self.panics.get(subject, False) is (event.kind == "panic_over")
                self.panics[subject] = event.kind == "panic"
                continue
            key: ProviderKey = subject
            assert self.enabled(key)
            p = self.shown(after, key)
            assert p is not None
            if event == PROBE:
                # Due while time advances; or at once when a swap turns probes on for it.
                assert step.kind in ("advance", "apply")
                assert self.connected(key), f"a probe of disconnected {key}"
                assert self.grouped_provider(key).probe
                assert p.ejected_until is not None
                assert key not in self.probes, "a second probe while one runs"
                self.probes.append(key)
                self.probe_sent[key] = self.now
                continue
            assert isinstance(event, HealthEvent)
            seen.setdefault(key, []).append(event.kind)
            if event.kind in ("connected", "disconnected"):
                assert step.link is not None
                assert (key[0], event.kind == "connected") == step.link
                assert p.connected is (event.kind == "connected")
                continue
            assert self.connected(key), f"{event} of disconnected {key}"
            if event.kind == "ejected":
                if step.kind == "advance":
                    # Probes kept failing: the ejection is renewed where it ends.
                    was = self.shown(before, key)
                    assert was is not None
                    assert was.ejected_until is not None
                    assert was.ejected_until <= self.now
                    assert self.grouped_provider(key).probe
                    assert key in probe_failed
                else:
                    assert step.kind in ("release", "fail")
                    assert step.outcome is not None
                    assert step.outcome[0] == key
                    assert isinstance(step.outcome[1], Failure)
                    if key in self.probe_recovered:
                        self.distrusted.add(key)  # probes pass, requests fail
                can_probe = self.grouped_provider(key).probe
                assert event.probes_trusted == ((key not in self.distrusted) if can_probe else None)
                self.run[key] += 1
                self.ejections[key] += 1
                self.ejected_at[key] = self.now
                self.probe_failed.discard(key)
                assert event.until == self.now + health.ejection_s(self.run[key])
                assert (event.failures, event.reason) == (self.failures[key], p.last_failure)
                assert p.ejected_until == event.until
                assert not p.half_open
            elif event.kind == "recovered":
                if event.via == "probe":
                    assert step.probe == (key, True)
                    assert key not in self.distrusted
                    self.probe_recovered.add(key)
                else:
                    assert step.kind == "release"
                    assert step.outcome == (key, OK)
                assert p.health == "healthy"
            elif event.kind == "half_open":
                assert step.kind == "advance"
                assert p.half_open
            else:
                assert event.kind == "held"
                assert step.outcome is not None
                assert step.outcome[0] == key
                failure = step.outcome[1]
                assert isinstance(failure, Failure)
                assert failure.retry_after
                assert event.until == self.now + min(
                    failure.retry_after, health.max_eject_ms / 1000.0
                )
                assert p.held_until == event.until
        for group in after.groups:
            assert self.panics.get(group.group_id, False) is group.panic
        for removed in set(self.panics) - {g.group_id for g in after.groups}:
            del self.panics[removed]
        self.check_expected_events(seen, step, probe_failed)

    def check_expected_events(
        self, seen: dict[ProviderKey, list[str]], step: Step, probe_failed: frozenset[ProviderKey]
    ) -> None:
        """The converse: what the operation must have caused did happen."""
        before, after = step.before, self.stats
        assert before is not None
        if step.link is not None:
            up = step.link[1]
            for key in KEYS:
                kinds = [k for k in seen.get(key, []) if k in ("connected", "disconnected")]
                changed = key in step.link_changed
                assert kinds == ([("connected" if up else "disconnected")] if changed else [])
        if step.outcome is not None:
            key, outcome = step.outcome
            was = self.shown(before, key)
            if self.enabled(key) and self.connected(key) and was is not None and was.enabled:
                if isinstance(outcome, Failure) and outcome.kind != "status_429":
                    ejects = was.half_open or (
                        was.ejected_until is None
                        and self.failures[key] >= self.policy.health.failure_threshold
                    )
                    assert ("ejected" in seen.get(key, [])) is ejects
                elif isinstance(outcome, Failure):
                    assert "ejected" not in seen.get(key, [])
                if outcome == OK:
                    p = self.shown(after, key)
                    assert p is not None
                    if self.stale_success:
                        assert p.health == was.health
                        assert p.ejected_until == was.ejected_until
                    else:
                        assert p.health == "healthy"
        if step.probe is not None:
            key, ok = step.probe
            was = self.shown(before, key)
            if was is not None and was.enabled:
                recovers = ok and self.probe_counts(key, was) and was.probes_trusted
                assert ("recovered" in seen.get(key, [])) is recovers
        if step.kind == "advance":
            for p in before.providers:
                key = (p.node_id, p.provider_id)
                if not p.enabled:
                    continue
                kinds = seen.get(key, [])
                if p.ejected_until is not None and p.ejected_until <= self.now:
                    renewed = self.grouped_provider(key).probe and key in probe_failed
                    assert kinds == (["ejected"] if renewed else ["half_open"]), kinds
                else:
                    assert "ejected" not in kinds
                    assert "half_open" not in kinds
        for key in KEYS:  # no health timer is ever left behind
            p = self.shown(after, key)
            if p is not None and p.enabled:
                assert p.ejected_until is None or p.ejected_until > self.now
                assert p.held_until is None or p.held_until > self.now

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
        group_id = request.group_id
        assert request.state is RequestState.DISPATCHED
        assert request.lease is lease
        assert key in self.policy.groups[group_id]
        assert self.free_for(key, request.long_context), "dispatch onto a full or disabled slot"
        tried = self.tried.setdefault(request.request_id, [])
        assert key not in tried, f"a retry went back to {key}, which it already tried"
        retry = bool(tried)
        immediate_retry = step.kind == "fail" and request is step.subject
        deadline = self.deadline(request)
        if not immediate_retry:
            assert deadline is None or self.now < deadline, "admitted at or after its deadline"
        # Health: out (ejected or held) providers only in panic. During an advance health
        # only improves, so the panic before the step is the one to allow it.
        panic_then = self.panic(self.stats, group_id)
        if step.kind == "advance":
            assert step.before is not None
            panic_then = panic_then or self.panic(step.before, group_id)
        assert panic_then or not self.out(self.stats, key), f"{key} is out, no panic: {request}"
        other_retries = any(self.fates[r].request.group_id == group_id for r in step.retries_before)
        if step.kind in ("submit", "apply") or (immediate_retry and not other_retries):
            # A new choice (not a freed slot handed on): lowest in_flight, then priority.
            def rank(k: ProviderKey) -> tuple[int, int]:
                p = self.provider(k)
                assert p is not None
                return (self.in_flight[k], p.priority)

            best = min(rank(k) for k in self.candidates(request))
            assert rank(key) == best, f"{key} chosen, a candidate ranked {best} was free"
        if self.half_open(self.stats, key) and not self.out(self.stats, key):
            # Half-open and not held: no group of it is in panic, so this is its trial.
            assert key not in self.trial, f"a second trial on half-open {key}"
            self.trial[key] = lease
        tried.append(key)
        self.in_flight[key] += 1
        self.long_in_flight[key] += request.long_context
        assert lease.long_context == request.long_context
        self.held.append(lease)
        step.dispatches.append((request, key, retry))

    def check_rejection(self, decision: Rejection, step: Step) -> None:
        request, reason = decision.request, decision.reason.value
        assert request.state is RequestState.REJECTED
        assert request.rejection is decision
        group = self.policy.groups.get(request.group_id)
        retry = bool(self.tried.get(request.request_id))
        if decision.config_change:
            assert step.kind == "apply"
            assert request is not step.subject
        if reason == "model_not_found":
            assert group is None
        elif reason == "no_available_provider":
            assert group is not None
            if retry:
                # No untried member left that health lets in (out only shrinks in an advance).
                assert step.before is not None
                stats = step.before if step.kind == "advance" else self.stats
                assert not self.untried_left(request, stats)
            else:
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
        before = step.before
        assert before is not None
        for waiting in self.pending():
            group_id = waiting.group_id
            members = self.policy.groups.get(group_id, ())
            tried = self.tried.get(waiting.request_id, ())
            waiting_retry = bool(tried)
            for taker, key, taker_retry in step.dispatches:
                if key not in members or key in tried:
                    continue
                # Could health let the waiting request use it then? (out only shrinks in an
                # advance, and a panic only ends.)
                was_out = self.out(before if step.kind == "advance" else self.stats, key)
                if was_out and not self.panic(self.stats, group_id):
                    continue
                if taker_retry:
                    # Requests failing over are served before the queue, oldest first.
                    overtook = waiting_retry and waiting.request_id < taker.request_id
                else:
                    overtook = waiting_retry or waiting.request_id < taker.request_id
                if not overtook:
                    continue
                p = self.provider(key)
                assert p is not None
                # The taker took a general slot on a provider of the waiting request's group:
                # fine only if that request needed a long slot that was full.
                # (Long slots only fill up while an operation dispatches.)
                could_serve = not waiting.long_context or (
                    taker.long_context or self.long_in_flight[key] < p.long_context_capacity
                )
                assert not could_serve, f"{taker} overtook {waiting} on {key}"

    # -- rules ----------------------------------------------------------------------------

    @rule(group=st.sampled_from([*GROUPS, "unknown"]), long_context=st.booleans())
    def submit(self, group: str, long_context: bool) -> None:
        step = self.begin("submit")
        submission = self.scheduler.submit(group, long_context=long_context, now=self.now)
        request = submission.request
        step.subject = request
        assert request.request_id not in self.fates
        assert request.submitted_at == self.now
        self.fates[request.request_id] = Fate(request)
        self.counts["submitted"] += 1
        self.finish(submission.decisions, step)

    @rule(
        groups=st.lists(st.sampled_from(GROUPS), min_size=2, max_size=5),
        long_context=st.booleans(),
    )
    def submit_burst(self, groups: list[str], long_context: bool) -> None:
        for group in groups:
            self.submit(group, long_context)

    def let_go(self, lease: SlotLease, outcome: Outcome) -> None:
        """Model the release of a held lease with ``outcome``."""
        key = lease.key
        self.held.remove(lease)
        self.in_flight[key] -= 1
        self.long_in_flight[key] -= lease.long_context
        self.released.append(lease)
        self.counts["released"] += 1
        if self.trial.get(key) is lease:
            del self.trial[key]
        self.stale_success = False
        if not self.enabled(key) or not self.connected(key):
            return  # (disconnected: the outcome says nothing of the provider)
        if outcome == OK:
            was = self.shown(self.stats, key)
            ejected_at = self.ejected_at.get(key)
            self.stale_success = (
                was is not None
                and (was.ejected_until is not None or was.half_open)
                and ejected_at is not None
                and lease.granted_at < ejected_at
            )
            if self.stale_success:
                return  # an answer to a request sent before the ejection says nothing now
            self.failures[key] = 0
            self.run[key] = 0
            self.probe_recovered.discard(key)
            self.distrusted.discard(key)
        elif isinstance(outcome, Failure) and outcome.kind != "status_429":
            self.failures[key] += 1

    @precondition(lambda self: self.held)
    @rule(data=st.data(), outcome=st.sampled_from(OUTCOMES))
    def release(self, data: st.DataObject, outcome: Outcome) -> None:
        self.release_one(data.draw(st.sampled_from(self.held)), outcome)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), fail_over=st.booleans())
    def failure_storm(self, data: st.DataObject, fail_over: bool) -> None:
        """Every attempt on one provider fails at once (a box went down)."""
        key = data.draw(st.sampled_from(sorted({lease.key for lease in self.held})))
        for lease in [lease for lease in self.held if lease.key == key]:
            if lease in self.held:
                if fail_over:
                    self.fail_one(lease, FAILURES[0])
                else:
                    self.release_one(lease, FAILURES[0])

    def release_one(self, lease: SlotLease, outcome: Outcome) -> None:
        step = self.begin("release", outcome=(lease.key, outcome))
        self.let_go(lease, outcome)
        decisions = self.scheduler.release(lease, self.now, outcome)
        assert lease.released
        self.finish(decisions, step)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), failure=st.sampled_from(FAILURES))
    def fail(self, data: st.DataObject, failure: Failure) -> None:
        self.fail_one(data.draw(st.sampled_from(self.held)), failure)

    def fail_one(self, lease: SlotLease, failure: Failure) -> None:
        request = lease.request
        assert request.lease is lease  # only the latest attempt of a request is held
        tried = frozenset(self.tried[request.request_id])
        assert request.attempts == len(tried)
        assert lease.key in tried
        step = self.begin("fail", request, outcome=(lease.key, failure))
        self.let_go(lease, failure)
        result = self.scheduler.fail(lease, failure, self.now)
        assert lease.released
        assert result.request is request
        assert request.tried == tried
        fate = self.fates[request.request_id]
        if result.retried:
            self.counts["failovers"] += 1
            fate.outcome = None  # it re-entered admission
        else:
            assert request.state is RequestState.DISPATCHED
            assert request.lease is None  # released: the request let go of it
        self.finish(result.decisions, step)
        # Retried exactly when an attempt is left and, once health has taken this failure in,
        # an untried member is not out (or the group is in panic).
        in_panic = self.panic(self.stats, request.group_id)
        untried = [
            k
            for k in self.policy.groups.get(request.group_id, ())
            if k not in tried
            and self.enabled(k)
            and self.connected(k)
            and (in_panic or not self.out(self.stats, k))
        ]
        expected = (
            may_retry(failure.kind, self.retry_on[lease.key])
            and len(tried) < self.policy.max_attempts
            and bool(untried)
        )
        deadline = self.deadline(request)
        if deadline is not None and self.now >= deadline:
            # Past its deadline it is retried only onto a slot free at once (never to wait).
            assert not result.retried or (expected and request.state is RequestState.DISPATCHED)
        else:
            assert result.retried is expected

    @precondition(lambda self: self.released)
    @rule(data=st.data())
    def release_again(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(self.released))
        assert self.scheduler.release(lease, self.now, OK) == []
        self.counts["double_releases"] += 1
        with pytest.raises(ValueError, match="already released"):
            self.scheduler.fail(lease, FAILURES[0], self.now)
        assert not self.scheduler.has_events

    @precondition(lambda self: self.fates)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        fate = data.draw(st.sampled_from(list(self.fates.values())))
        step = self.begin("cancel", fate.request)
        self.finish(self.scheduler.cancel(fate.request, self.now), step)

    @precondition(lambda self: self.probes)
    @rule(data=st.data(), ok=st.booleans())
    def probe_result(self, data: st.DataObject, ok: bool) -> None:
        key = self.probes.pop(data.draw(st.integers(0, len(self.probes) - 1)))
        step = self.begin("probe", probe=(key, ok))
        was = self.shown(self.stats, key)
        assert was is not None
        assert was.enabled
        assert self.connected(key)  # (its probes are dropped when its link goes down)
        counts = self.probe_counts(key, was)
        if ok:
            self.probes_ok[key] += 1
            if counts and key not in self.distrusted:
                self.failures[key] = 0
            elif counts and was.ejected_until is not None:
                self.probe_failed.discard(key)  # distrusted: it only says probes pass
        else:
            self.probes_failed[key] += 1
            if counts and was.ejected_until is not None:
                self.probe_failed.add(key)
        reason = None if ok else "GET /models: connection refused"
        self.finish(self.scheduler.probed(key, ok, reason, self.now), step)

    def probe_counts(self, key: ProviderKey, was: ProviderStatistics) -> bool:
        """Whether a probe result of ``key`` (as ``was`` before it) speaks of its ejection: it
        is ejected or half-open, and the probe was sent during this ejection."""
        ejected_at = self.ejected_at.get(key)
        return (was.ejected_until is not None or was.half_open) and (
            ejected_at is None or self.probe_sent[key] >= ejected_at
        )

    @rule(dt=st.sampled_from([0.0, 0.125, 0.25, 0.5, 1.0, 2.5]))
    def advance(self, dt: float) -> None:
        step = self.begin("advance")
        self.now += dt
        self.finish(self.scheduler.expire(self.now), step)

    @rule()
    def advance_to_next_event(self) -> None:
        when = self.scheduler.next_event()
        if when is None:
            return
        assert when > self.now
        step = self.begin("advance")
        self.now = when
        self.finish(self.scheduler.expire(self.now), step)

    @rule(data=st.data())
    def apply_policy(self, data: st.DataObject) -> None:
        policy = data.draw(tweaked_policies(self.policy, self.remote_nodes))
        step = self.begin("apply")
        self.policy = policy
        self.retry_on.update((p.key, p.retry_on) for p in policy.providers)
        self.finish(self.scheduler.apply_policy(policy, self.now), step)

    @rule(node=st.sampled_from(NODES), up=st.booleans())
    def link(self, node: str, up: bool) -> None:
        """A node's link comes up or goes down (for a local node: nothing changes)."""
        step = self.begin("link")
        step.link = (node, up)
        was = {key: self.connected(key) for key in KEYS}
        if node in self.remote_nodes:
            if up:
                self.up.add(node)
            else:
                self.up.discard(node)
        step.link_changed = frozenset(
            key for key in KEYS if self.enabled(key) and was[key] is not self.connected(key)
        )
        self.finish(self.scheduler.set_connected(node, up, self.now), step)

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
            assert request.tried == frozenset(self.tried.get(request.request_id, ()))
            assert request.attempts == len(self.tried.get(request.request_id, ()))
        deadlines = [r.deadline for r in self.pending() if r.deadline is not None]
        next_deadline = self.scheduler.next_deadline()
        assert next_deadline == (min(deadlines) if deadlines else None)
        # The next event is never later than a deadline or a health timer.
        timers = [
            t
            for p in self.stats.providers
            if p.enabled
            for t in (p.ejected_until, p.held_until)
            if t is not None
        ]
        next_event = self.scheduler.next_event()
        if deadlines or timers:
            assert next_event is not None
            assert next_event <= min(deadlines + timers)
        assert next_event is None or next_event > self.now

    @invariant()
    def work_conserving(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        for request in self.pending():
            assert not self.candidates(request), f"{request} waits beside a free slot"
            if self.tried.get(request.request_id):
                # A request failing over waits only for a member it may still get.
                assert self.untried_left(request, self.stats), f"{request} waits for nothing"

    @invariant()
    def health_agrees_with_the_model(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        stats = self.stats
        for group in stats.groups:
            members = [k for k in self.policy.groups[group.group_id] if self.enabled(k)]
            assert group.members == len(members)  # (connected or not)
            live = [k for k in members if self.connected(k)]
            assert group.panic is (bool(live) and all(self.out(stats, k) for k in live))
        for key, lease in self.trial.items():
            assert lease in self.held
            assert lease.key == key
        for p in stats.providers:
            key = (p.node_id, p.provider_id)
            assert p.connected is self.connected(key)
            if not p.enabled:
                continue
            if not p.connected:
                assert p.health == "disconnected"
                assert (p.ejected_until, p.held_until, p.half_open) == (None, None, False)
            else:
                assert p.health in ("unknown", "healthy", "unhealthy")
            assert (p.health == "unhealthy") is (p.ejected_until is not None or p.half_open)
            assert not (p.half_open and p.ejected_until is not None)
            assert (p.consecutive_failures, p.ejections) == (
                self.failures[key],
                self.ejections[key],
            )
            assert (p.probes_ok, p.probes_failed) == (self.probes_ok[key], self.probes_failed[key])
            assert p.probes_trusted is (key not in self.distrusted)

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
        assert stats.released == self.counts["released"] == len(self.released)
        assert stats.double_releases == self.counts["double_releases"]
        assert stats.failovers == self.counts["failovers"]
        assert stats.submitted + stats.failovers == (
            stats.admitted + stats.rejected_total + stats.queue_depth
        )
        assert all(lease.released for lease in self.released)
        assert not any(lease.released for lease in self.held)
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
                assert p.status == "active"
                assert (p.capacity, p.long_context_capacity, p.priority) == (
                    policy.capacity,
                    policy.long_context_capacity,
                    policy.priority,
                )
            else:
                assert (p.status, p.health, p.capacity) == ("disabled", "disabled", 0)


# Inherits the loaded profile (derandomized "ci" by default); sized to run in a few seconds.
SchedulerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=80)
TestSchedulerMachine = SchedulerMachine.TestCase
