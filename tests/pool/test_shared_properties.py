"""Hypothesis state machine of the scheduler in a shared pool: whatever the leases held
elsewhere do (``set_elsewhere``) and however often the store refuses a dispatch
(``requeue``), a dispatch never takes a provider past its capacity less what is held
elsewhere, a principal past its ``max_in_flight`` less its leases elsewhere, the counters agree,
and every request ends exactly once."""

from __future__ import annotations

import dataclasses

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from iop_edge.pool import (
    Decision,
    Dispatch,
    PendingRequest,
    PoolScheduler,
    Rejection,
    RequestState,
    SlotLease,
)
from tests.helpers.pool import check_counters, key, pool, provider

PROVIDERS = ("a", "b")
PRINCIPALS = ("app", "other")
CAP = 2  # app's max_in_flight


class SharedPoolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        policy = dataclasses.replace(
            pool(
                [provider("a", capacity=3, long=1), provider("b", capacity=2, long=2)],
                max_queue=64,
                queue_timeout_ms=4000,
            ),
            caps={"app": CAP},
            principals=PRINCIPALS,
        )
        self.scheduler = PoolScheduler(policy)
        self.now = 0.0
        self.leases: list[SlotLease] = []
        self.ended: set[int] = set()
        self.requests: dict[int, PendingRequest] = {}

    def take(self, decisions: list[Decision]) -> None:
        for decision in decisions:
            request = decision.request
            if isinstance(decision, Dispatch):
                assert request.request_id not in self.ended
                self.leases.append(decision.lease)
            else:
                assert isinstance(decision, Rejection)
                assert request.request_id not in self.ended, "a request ended twice"
                self.ended.add(request.request_id)
        self.check_caps()

    def check_caps(self) -> None:
        stats = self.scheduler.statistics()
        for shown in stats.providers:
            held = [
                lease
                for lease in self.leases
                if not lease.released and lease.provider_id == shown.provider_id
            ]
            assert shown.in_flight == len(held)
        for principal in stats.principals:
            if principal.max_in_flight is not None and principal.in_flight:
                assert principal.in_flight <= max(
                    principal.max_in_flight - principal.in_flight_elsewhere, self.raised_app
                )

    raised_app = 0  # app's in flight when its leases elsewhere last went up (may exceed)

    @rule(long=st.booleans(), principal=st.sampled_from(PRINCIPALS))
    def submit(self, long: bool, principal: str) -> None:
        before = self.free()
        submission = self.scheduler.submit(
            "m", long_context=long, now=self.now, principal=principal
        )
        self.requests[submission.request.request_id] = submission.request
        for decision in submission.decisions:
            if isinstance(decision, Dispatch):
                provider_id = decision.lease.provider_id
                assert before[provider_id] > 0, "dispatched onto a provider with no room"
        self.take(submission.decisions)

    def free(self) -> dict[str, int]:
        """Each provider's room now: capacity less in flight less held elsewhere."""
        return {
            p.provider_id: p.capacity - p.in_flight - p.held_elsewhere
            for p in self.scheduler.statistics().providers
        }

    def live(self) -> list[SlotLease]:
        return [lease for lease in self.leases if not lease.released]

    @precondition(lambda self: any(not lease.released for lease in self.leases))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(self.live()))
        before = self.free()
        decisions = self.scheduler.release(lease, self.now)
        self.ended.add(lease.request.request_id)
        self.check_dispatches(decisions, before, freed=lease.provider_id)
        self.take(decisions)

    @precondition(lambda self: any(not lease.released for lease in self.leases))
    @rule(data=st.data(), general=st.integers(0, 4), long=st.integers(0, 2))
    def store_refuses(self, data: st.DataObject, general: int, long: int) -> None:
        lease = data.draw(st.sampled_from(self.live()))
        request = lease.request
        deadline = request.deadline
        self.take(self.scheduler.set_elsewhere({lease.key: (general, long)}, {}, self.now))
        if lease.released:
            return  # (its request was cancelled meanwhile: nothing to refuse)
        decisions = self.scheduler.requeue(lease, self.now)
        assert request.request_id not in self.ended
        if request.state is RequestState.PENDING:
            assert request.deadline == deadline  # its place and its deadline kept
        self.take(decisions)

    def check_dispatches(
        self, decisions: list[Decision], before: dict[str, int], freed: str
    ) -> None:
        room = dict(before)
        room[freed] += 1
        for decision in decisions:
            if isinstance(decision, Dispatch):
                room[decision.lease.provider_id] -= 1
                assert room[decision.lease.provider_id] >= 0, "dispatched past the shared cap"

    @rule(
        pid=st.sampled_from(PROVIDERS),
        general=st.integers(0, 4),
        long=st.integers(0, 2),
        app=st.integers(0, 3),
    )
    def elsewhere(self, pid: str, general: int, long: int, app: int) -> None:
        was = self.scheduler.statistics()
        before = self.free()
        shown_app = next(p for p in was.principals if p.principal == "app")
        if app > shown_app.in_flight_elsewhere:
            self.raised_app = shown_app.in_flight
        decisions = self.scheduler.set_elsewhere(
            {key(pid): (general, long)}, {"app": app}, self.now
        )
        after = {
            p.provider_id: p.capacity - p.in_flight - p.held_elsewhere
            for p in self.scheduler.statistics().providers
        }
        dispatched = [d for d in decisions if isinstance(d, Dispatch)]
        for provider_id, room in after.items():
            if any(d.lease.provider_id == provider_id for d in dispatched):
                assert room >= 0, "set_elsewhere dispatched past the shared cap"
        del before
        self.take(decisions)

    @rule(dt=st.sampled_from([0.5, 1.0, 3.0]))
    def advance(self, dt: float) -> None:
        self.now += dt
        self.take(self.scheduler.expire(self.now))

    @invariant()
    def counters_agree(self) -> None:
        check_counters(self.scheduler)
        stats = self.scheduler.statistics()
        assert stats.released + stats.in_flight == stats.admitted + stats.inherited


SharedPoolMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40)
TestSharedPoolMachine = SharedPoolMachine.TestCase
