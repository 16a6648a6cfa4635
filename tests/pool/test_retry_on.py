"""``retry_on`` (issue 25): which failures before the response head fail over, per provider.

A failover may run the work twice: only what the provider's rule lists is retried on another
provider — an HTTP provider retries every class by default, a ``cli`` provider only a command
that could not be spawned. A 429 always fails over. A failure that is not retried still counts
for the provider's health, and is the answer. The pure scheduler decides; the config gives each
provider type its default.
"""

from __future__ import annotations

import pytest

from iop_edge.config import parse_config
from iop_edge.config.policy import pool_policy
from iop_edge.errors import FailureKind
from iop_edge.pool import RETRY_CLASSES, Failure, PoolScheduler, may_retry
from iop_edge.pool.policy import RETRY_CLASS_OF
from tests.helpers.config import base_doc, node
from tests.helpers.pool import check_counters, key, lease_of, pool, provider, shown

HTTP_DEFAULT = frozenset(RETRY_CLASSES)
CLI_DEFAULT = frozenset({"connect"})

# (failure kind, its class, retried by an HTTP provider's default, by a cli provider's default)
KINDS = [
    ("connect", "connect", True, True),  # never sent: refused, DNS, a command not spawned
    ("dropped", "timeout_before_head", True, False),  # sent; the connection broke before a head
    ("timeout", "timeout_before_head", True, False),  # sent; no head in request_timeout_ms
    ("status_5xx", "5xx", True, False),  # an answered 500/502/503/504
    ("exit", "5xx", True, False),  # a cli that exited non-zero before any output
    ("status_429", None, True, True),  # refused: no work was done, always fails over
    ("protocol", None, False, False),  # an answer broke off after it started: never
]


def test_every_failure_kind_has_one_class() -> None:
    assert {kind: cls for kind, cls, _, _ in KINDS} == dict(RETRY_CLASS_OF)
    assert set(RETRY_CLASS_OF) == set(FailureKind.__args__)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("kind", "http", "cli"), [(k, h, c) for k, _, h, c in KINDS])
def test_the_failover_decision_per_class_and_provider_type(
    kind: FailureKind, http: bool, cli: bool
) -> None:
    """What each provider type's default rule does with each failure, in the scheduler."""
    for retry_on, expected in ((HTTP_DEFAULT, http), (CLI_DEFAULT, cli)):
        assert may_retry(kind, retry_on) is expected
        scheduler = PoolScheduler(
            pool([provider("a", retry_on=retry_on), provider("b", retry_on=retry_on)])
        )
        lease = lease_of(scheduler)
        assert lease.provider_id == "a"
        result = scheduler.fail(lease, Failure(kind, "it failed", 5.0), 0.0)
        assert result.retried is expected, (kind, sorted(retry_on))
        request = result.request
        assert request.tried == frozenset({key("a")})
        if expected:
            assert request.lease is not None
            assert request.lease.provider_id == "b"
        else:
            assert (request.lease, request.attempts) == (None, 1)
            assert scheduler.statistics().failovers == 0
        check_counters(scheduler)


def test_a_failure_that_is_not_retried_still_counts_for_the_providers_health() -> None:
    """Three exits before any output on a cli provider (``[connect]``): no failover, each
    one the client's answer, and the provider is ejected as with failover."""
    scheduler = PoolScheduler(
        pool([provider("agent", retry_on=CLI_DEFAULT), provider("other", priority=1)])
    )
    for count in (1, 2):
        result = scheduler.fail(lease_of(scheduler), Failure("exit", "exited 1"), 0.0)
        assert not result.retried
        assert shown(scheduler, "agent").consecutive_failures == count
    assert shown(scheduler, "agent").ejected_until is not None  # the builders' threshold: 2
    assert lease_of(scheduler).provider_id == "other"
    assert scheduler.statistics().failovers == 0


def test_an_empty_rule_fails_over_only_a_429() -> None:
    scheduler = PoolScheduler(
        pool([provider("a", capacity=2, retry_on=frozenset()), provider("b", capacity=2)])
    )
    assert not scheduler.fail(lease_of(scheduler), Failure("connect", "refused"), 0.0).retried
    busy = Failure("status_429", "the provider answered 429")
    assert scheduler.fail(lease_of(scheduler), busy, 0.0).retried


def test_the_rule_of_the_provider_that_failed_decides() -> None:
    """A cli provider fails first (not retried); an HTTP provider failing first is retried,
    onto the cli provider — whose own failure is then the answer."""
    http = provider("http", capacity=2)
    agent = provider("agent", capacity=2, priority=1, retry_on=CLI_DEFAULT)
    scheduler = PoolScheduler(pool([http, agent], max_attempts=3))
    first = scheduler.fail(lease_of(scheduler), Failure("status_5xx", "503"), 0.0)
    assert first.retried
    retried = first.request.lease
    assert retried is not None
    assert retried.provider_id == "agent"
    assert not scheduler.fail(retried, Failure("exit", "exited 1"), 0.0).retried


def test_retry_on_changes_live_for_the_next_failure() -> None:
    providers = [provider("a", capacity=2, retry_on=CLI_DEFAULT), provider("b", capacity=2)]
    scheduler = PoolScheduler(pool(providers))
    timeout = Failure("timeout", "no response head in time")
    assert not scheduler.fail(lease_of(scheduler), timeout, 0.0).retried
    widened = [provider("a", capacity=2), provider("b", capacity=2)]
    scheduler.apply_policy(pool(widened), 0.0)
    assert scheduler.fail(lease_of(scheduler), timeout, 0.0).retried


def test_a_rule_with_an_unknown_class_is_refused() -> None:
    with pytest.raises(ValueError, match=r"retry_on \['4xx'\] names no class"):
        provider("a", retry_on=frozenset({"4xx"}))


# -- each provider type's default, from the config ----------------------------------------------


def test_http_providers_retry_every_class_and_cli_providers_only_connect_by_default() -> None:
    doc = base_doc()
    providers = node(doc)["providers"]
    providers.append(
        {
            "id": "ol",
            "type": "ollama",
            "category": "local_inference",
            "adapter": "ollama-local",
            "models": ["chat"],
        }
    )
    providers.append(
        {"id": "agent", "type": "cli", "category": "cli", "adapter": "shell", "models": ["chat"]}
    )
    providers.append(
        {
            "id": "careful",
            "type": "openai_compat",
            "category": "api",
            "adapter": "vllm-main",
            "models": ["chat"],
            "retry_on": ["connect"],
        }
    )
    providers.append(
        {
            "id": "bold-agent",
            "type": "cli",
            "category": "cli",
            "adapter": "shell",
            "models": ["chat"],
            "retry_on": ["connect", "5xx"],
        }
    )
    config = parse_config(doc)
    effective = {p.id: p.retry_on for p in config.nodes[0].providers}
    assert effective == {
        "vllm-a": RETRY_CLASSES,
        "ol": RETRY_CLASSES,
        "agent": ("connect",),
        "careful": ("connect",),
        "bold-agent": ("connect", "5xx"),
    }
    rules = {p.provider_id: p.retry_on for p in pool_policy(config).providers}
    assert rules == {pid: frozenset(classes) for pid, classes in effective.items()}
