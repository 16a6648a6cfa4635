"""Remote providers in the pure scheduler (issue 29): a provider whose node reaches the edge over
a node link is ``disconnected`` while that link is down. Its requests queue (a node back within
``queue_timeout_ms`` loses nothing), nothing is dispatched to it, panic and failover look at the
connected members only, its health timers and probes stop, and its health starts over when the
link is back, with its free slots handed out at once. Sync, ``now`` given.
"""

from __future__ import annotations

from iop_edge.config.policy import pool_policy, route_provider
from iop_edge.pool import (
    OK,
    PROBE,
    HealthEvent,
    PoolScheduler,
    ProviderKey,
    ProviderPolicy,
    Rejection,
    RequestState,
)
from tests.helpers.config import HASH_A, base_doc, load
from tests.helpers.pool import (
    REFUSED,
    check_counters,
    dispatched,
    eject,
    key,
    lease_of,
    panic,
    pool,
    provider,
    queued,
    rejected,
    shown,
)

FAR: ProviderKey = ("far", "r")
"""The remote provider of these tests: ``r`` on node ``far``."""

CONNECTED = HealthEvent("connected")
DISCONNECTED = HealthEvent("disconnected")


def far(
    pid: str = "r",
    *,
    capacity: int = 1,
    priority: int = 0,
    probe: bool = False,
    enabled: bool = True,
) -> ProviderPolicy:
    """A remote provider on node ``far``."""
    return provider(
        pid,
        node="far",
        remote=True,
        capacity=capacity,
        priority=priority,
        probe=probe,
        enabled=enabled,
    )


# -- queueing and dispatch -----------------------------------------------------------------------


def test_a_remote_provider_starts_disconnected_its_requests_queue_and_go_to_it_once_connected():
    scheduler = PoolScheduler(pool([far(capacity=2)], queue_timeout_ms=5000))
    p = shown(scheduler, "r")
    assert (p.status, p.health, p.connected, p.capacity) == ("active", "disconnected", False, 2)
    first = queued(scheduler, now=0.0)
    second = queued(scheduler, now=1.0)
    third = queued(scheduler, now=2.0)
    assert scheduler.queue_depth == 3
    assert scheduler.take_events() == []

    decisions = scheduler.set_connected("far", True, 3.0)
    assert dispatched(decisions) == [(first.request_id, "r"), (second.request_id, "r")]
    assert third.state is RequestState.PENDING
    assert first.lease is not None
    assert first.lease.granted_at == 3.0
    assert scheduler.take_events() == [(FAR, CONNECTED)]
    p = shown(scheduler, "r")
    assert (p.health, p.connected, p.in_flight) == ("unknown", True, 2)
    assert dispatched(scheduler.release(first.lease, 4.0, OK)) == [(third.request_id, "r")]
    check_counters(scheduler)


def test_a_link_down_past_queue_timeout_ms_times_its_requests_out_as_usual():
    scheduler = PoolScheduler(pool([far()], queue_timeout_ms=5000))
    early = queued(scheduler, now=0.0)
    late = queued(scheduler, now=2.0)
    assert scheduler.next_event() == 5.0
    assert rejected(scheduler.expire(5.0)) == [(early.request_id, "queue_timeout", False)]
    # Back before the second one's deadline: it loses nothing.
    assert dispatched(scheduler.set_connected("far", True, 6.5)) == [(late.request_id, "r")]
    check_counters(scheduler)


def test_leases_outlive_the_link_and_are_released_once_by_their_holders():
    scheduler = PoolScheduler(pool([far()]))
    scheduler.set_connected("far", True, 0.0)
    lease = lease_of(scheduler, now=0.0)
    waiting = queued(scheduler, now=0.5)
    assert scheduler.set_connected("far", False, 1.0) == []
    assert not lease.released
    p = shown(scheduler, "r")
    assert (p.health, p.in_flight) == ("disconnected", 1)
    # The attempt ends with the link: its slot is free, and goes to nobody while the link is down.
    assert scheduler.release(lease, 1.5, REFUSED) == []
    assert lease.released
    assert waiting.state is RequestState.PENDING
    # A failure seen while the link is down says nothing of the provider.
    assert shown(scheduler, "r").consecutive_failures == 0
    assert scheduler.release(lease, 1.5, OK) == []
    stats = scheduler.statistics()
    assert (stats.released, stats.double_releases, stats.in_flight) == (1, 1, 0)
    assert dispatched(scheduler.set_connected("far", True, 2.0)) == [(waiting.request_id, "r")]
    assert scheduler.take_events() == [(FAR, CONNECTED), (FAR, DISCONNECTED), (FAR, CONNECTED)]
    check_counters(scheduler)


# -- panic and failover --------------------------------------------------------------------------


def test_panic_counts_the_connected_members_only_and_never_sends_to_a_disconnected_one():
    scheduler = PoolScheduler(pool([provider("a"), far(priority=1)]))
    scheduler.set_connected("far", True, 0.0)
    eject(scheduler, "a")
    assert not panic(scheduler)  # r is connected and not out
    scheduler.take_events()

    scheduler.set_connected("far", False, 0.5)
    assert panic(scheduler)  # a, the one connected member, is out
    assert scheduler.take_events() == [(FAR, DISCONNECTED), ("m", HealthEvent("panic"))]
    assert lease_of(scheduler, now=0.5).provider_id == "a"
    waiting = queued(scheduler, now=0.5)  # a is full; r is no candidate, panic or not

    decisions = scheduler.set_connected("far", True, 0.75)
    assert dispatched(decisions) == [(waiting.request_id, "r")]
    assert not panic(scheduler)
    assert scheduler.take_events() == [(FAR, CONNECTED), ("m", HealthEvent("panic_over"))]
    check_counters(scheduler)


def test_a_group_whose_every_member_is_disconnected_is_not_in_panic():
    scheduler = PoolScheduler(pool([far()]))
    scheduler.set_connected("far", True, 0.0)
    eject(scheduler, "r")
    assert panic(scheduler)
    scheduler.take_events()
    scheduler.set_connected("far", False, 0.5)
    assert not panic(scheduler)
    assert scheduler.take_events() == [(FAR, DISCONNECTED), ("m", HealthEvent("panic_over"))]


def test_a_failing_request_is_not_retried_on_a_disconnected_provider():
    scheduler = PoolScheduler(pool([provider("a"), far(priority=1)]))
    lease = lease_of(scheduler)
    assert lease.provider_id == "a"
    result = scheduler.fail(lease, REFUSED, 0.5)
    assert result.retried is False  # the failure is the answer
    assert result.request.tried == frozenset({key("a")})
    assert result.decisions == []
    check_counters(scheduler)


def test_requests_failing_over_that_only_a_lost_provider_could_take_end_no_available_provider():
    scheduler = PoolScheduler(pool([provider("a"), far(priority=1)]))
    scheduler.set_connected("far", True, 0.0)
    on_a = lease_of(scheduler)
    on_r = lease_of(scheduler)
    assert (on_a.provider_id, on_r.provider_id) == ("a", "r")
    waiting = queued(scheduler)
    result = scheduler.fail(on_a, REFUSED, 0.5)
    assert result.retried  # it waits for r (busy), ahead of the queue; a goes to the queue
    assert dispatched(result.decisions) == [(waiting.request_id, "a")]
    later = queued(scheduler, now=0.5)

    decisions = scheduler.set_connected("far", False, 1.0)
    assert rejected(decisions) == [(result.request.request_id, "no_available_provider", False)]
    [rejection] = decisions
    assert isinstance(rejection, Rejection)
    assert rejection.message == (
        "model group 'm' has no provider left that this request has not tried"
    )
    assert later.state is RequestState.PENDING  # a queued request still waits (for a or r)
    assert not on_r.released  # its holder releases it
    check_counters(scheduler)


# -- health --------------------------------------------------------------------------------------


def test_health_starts_over_unknown_when_the_link_is_back_and_the_counters_are_kept():
    scheduler = PoolScheduler(pool([far()]))
    scheduler.set_connected("far", True, 0.0)
    eject(scheduler, "r")
    p = shown(scheduler, "r")
    assert (p.health, p.ejected_until, p.ejections) == ("unhealthy", 1.0, 1)

    scheduler.set_connected("far", False, 0.25)
    p = shown(scheduler, "r")
    assert (p.health, p.ejected_until, p.consecutive_failures, p.ejections) == (
        "disconnected",
        None,
        0,
        1,
    )
    assert scheduler.next_event() is None  # its ejection's timer went with its health

    scheduler.set_connected("far", True, 0.5)
    p = shown(scheduler, "r")
    assert (p.health, p.ejected_until, p.consecutive_failures, p.last_failure, p.ejections) == (
        "unknown",
        None,
        0,
        None,
        1,
    )
    # A candidate at once, before the old ejection would have ended.
    assert lease_of(scheduler, now=0.5).provider_id == "r"


def test_a_disconnected_provider_is_not_idle_probed_and_its_checks_resume_once_it_is_back():
    scheduler = PoolScheduler(pool([far(probe=True)]))
    scheduler.set_connected("far", True, 0.0)
    scheduler.start(0.0)
    assert scheduler.next_event() == 0.25
    scheduler.take_events()

    scheduler.set_connected("far", False, 0.125)
    assert scheduler.next_event() is None
    assert scheduler.expire(10.0) == []
    assert scheduler.take_events() == [(FAR, DISCONNECTED)]

    scheduler.set_connected("far", True, 10.0)
    assert scheduler.next_event() == 10.25
    assert scheduler.expire(10.25) == []
    assert scheduler.take_events() == [(FAR, CONNECTED), (FAR, PROBE)]


def test_an_ejected_provider_is_not_probed_while_down_and_a_late_probe_result_changes_nothing():
    scheduler = PoolScheduler(pool([far(probe=True)]))
    scheduler.set_connected("far", True, 0.0)
    eject(scheduler, "r")
    assert scheduler.next_event() == 0.25
    scheduler.expire(0.25)
    assert scheduler.take_events()[-1] == (FAR, PROBE)

    scheduler.set_connected("far", False, 0.375)
    assert scheduler.probed(FAR, True, None, 0.375) == []
    p = shown(scheduler, "r")
    assert (p.health, p.probes_ok, p.probes_failed) == ("disconnected", 0, 0)
    assert scheduler.next_event() is None
    assert scheduler.expire(5.0) == []
    assert scheduler.take_events() == [(FAR, DISCONNECTED), ("m", HealthEvent("panic_over"))]


# -- statistics, local nodes, policy swaps, config -----------------------------------------------


def test_statistics_read_disconnected_while_the_link_is_down_and_disabled_wins():
    scheduler = PoolScheduler(pool([provider("a"), far(), far("off", enabled=False)]))

    def views() -> dict[str, tuple[str, str, bool]]:
        return {
            p.provider_id: (p.status, p.health, p.connected)
            for p in scheduler.statistics().providers
        }

    assert views() == {
        "a": ("active", "unknown", True),
        "r": ("active", "disconnected", False),
        "off": ("disabled", "disabled", False),
    }
    assert scheduler.statistics().groups[0].members == 2  # a and r: r is an enabled member
    scheduler.set_connected("far", True, 0.0)
    assert views() == {
        "a": ("active", "unknown", True),
        "r": ("active", "unknown", True),
        "off": ("disabled", "disabled", True),
    }
    assert scheduler.take_events() == [(FAR, CONNECTED)]  # none for the disabled one


def test_a_local_node_has_no_link_and_set_connected_changes_nothing_for_it():
    scheduler = PoolScheduler(pool([provider("a"), provider("b")]))
    assert all(p.connected for p in scheduler.statistics().providers)
    assert scheduler.set_connected("n1", False, 0.0) == []
    assert scheduler.set_connected("nowhere", False, 0.0) == []
    assert scheduler.take_events() == []
    assert all(p.health == "unknown" for p in scheduler.statistics().providers)
    assert lease_of(scheduler).provider_id == "a"


def test_policy_swaps_keep_the_link_state_and_a_provider_added_to_a_connected_node_is_connected():
    scheduler = PoolScheduler(pool([far()]))
    waiting = queued(scheduler)
    # A live change while the link is down: still down, and the request still waits.
    assert scheduler.apply_policy(pool([far(capacity=2)]), 1.0) == []
    assert shown(scheduler, "r").health == "disconnected"
    assert waiting.state is RequestState.PENDING
    assert dispatched(scheduler.set_connected("far", True, 2.0)) == [(waiting.request_id, "r")]

    scheduler.apply_policy(pool([far(capacity=2), far("r2")]), 3.0)
    assert [(p.provider_id, p.health) for p in scheduler.statistics().providers] == [
        ("r", "unknown"),
        ("r2", "unknown"),
    ]
    # Disabled and enabled again while the link is up: connected.
    scheduler.apply_policy(pool([far(capacity=2, enabled=False), far("r2")]), 4.0)
    scheduler.apply_policy(pool([far(capacity=2), far("r2")]), 5.0)
    assert shown(scheduler, "r").connected
    # Removed while the link is down, added back after it is up again: connected.
    scheduler.set_connected("far", False, 6.0)
    scheduler.apply_policy(pool([far("r2")]), 7.0)
    scheduler.set_connected("far", True, 8.0)
    scheduler.apply_policy(pool([far(), far("r2")]), 9.0)
    assert [(p.provider_id, p.health) for p in scheduler.statistics().providers] == [
        ("r", "unknown"),
        ("r2", "unknown"),
    ]


def test_pool_policy_marks_the_providers_of_a_node_with_a_token_remote_and_never_a_route():
    doc = base_doc()
    doc["nodes"].append(
        {
            "id": "box",
            "token_hash_sha256": HASH_A,
            "adapters": [
                {"name": "vllm-box", "type": "openai_compat", "base_url": "http://10.0.0.2/v1"}
            ],
            "providers": [
                {
                    "id": "vllm-b",
                    "type": "openai_compat",
                    "category": "local_inference",
                    "adapter": "vllm-box",
                    "models": ["chat"],
                }
            ],
        }
    )
    doc["models"][0]["providers"].append("vllm-b")
    doc["openai"] = {"model_routes": [{"model": "raw", "adapter": "vllm-box", "target": "llama"}]}
    policy = pool_policy(load(doc))
    assert {p.key: p.remote for p in policy.providers} == {
        ("gpu-1", "vllm-a"): False,
        ("box", "vllm-b"): True,
        # A route has no health: while its node is down it fails at once, it does not queue.
        ("box", route_provider("raw")): False,
    }
