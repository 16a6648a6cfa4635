"""``provider_pool.shared``: several edges sharing one pool through a store (Redis/Valkey) —
the store's URL (redis://, rediss://, unix://; checked, every defect named), the lease TTL and
the store-down mode with their defaults and bounds, ``${VAR}`` in the URL, the refresh classes
(the store restart-class, the rest live) and the pool policy the config maps to."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import yaml

from iop_edge.config.policy import pool_policy, shared_policy
from iop_edge.config.refresh import RESTART_REASONS, RefreshOutcome, classify, refresh
from iop_edge.config.schema import SharedSection
from iop_edge.pool import PoolPolicy, SharedPolicy
from tests.helpers.config import base_doc, load, problem_at, problems, with_shared

PATH = "provider_pool.shared"
STORE = f"{PATH}.store"
REDIS_FORM = "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]"
UNIX_FORM = "unix://[[USER]:PASSWORD@]/SOCKET/PATH[?db=DB]"
EVERY_FORM = f"{REDIS_FORM}, rediss://[[USER]:PASSWORD@]HOST[:PORT][/DB] or {UNIX_FORM}"


# --- parsing and defaults -----------------------------------------------------------------


def test_without_shared_the_pool_is_not_shared_and_its_policy_says_so() -> None:
    config = load(base_doc())
    assert config.provider_pool.shared is None
    assert pool_policy(config).shared is None


def test_a_store_alone_takes_the_defaults_10_s_and_static_split() -> None:
    shared = load(with_shared(store="redis://10.0.0.5:6379/0")).provider_pool.shared
    assert shared == SharedSection(
        store="redis://10.0.0.5:6379/0", lease_ttl_ms=10_000, on_store_down="static_split"
    )


def test_every_field_given_is_kept() -> None:
    doc = with_shared(
        store="unix:///run/redis.sock?db=3", lease_ttl_ms=2500, on_store_down="reject"
    )
    shared = load(doc).provider_pool.shared
    assert shared is not None
    assert (shared.store, shared.lease_ttl_ms, shared.on_store_down) == (
        "unix:///run/redis.sock?db=3",
        2500,
        "reject",
    )


@pytest.mark.parametrize(
    "url",
    [
        "redis://localhost",
        "redis://10.0.0.5:6379",
        "redis://10.0.0.5:6379/",
        "redis://10.0.0.5:6379/15",
        "redis://:pw@10.0.0.5:6379/0",
        "redis://edge:pw@redis.internal:6380/1",
        "redis://edge@redis.internal",
        "redis://[::1]:6379/0",
        "redis://10.0.0.5?db=2",
        "REDIS://10.0.0.5",
        "rediss://:pw@redis.example.com:6380/0",
        "redis://:p%2Fw%3Fd%23@10.0.0.5",
        "unix:///run/redis/redis.sock",
        "unix:///run/redis.sock?db=0",
        "unix://:pw@/run/redis.sock?db=4",
        "unix:///run/redis@1.sock",
    ],
)
def test_each_form_of_store_url_is_accepted_as_written(url: str) -> None:
    shared = load(with_shared(store=url)).provider_pool.shared
    assert shared is not None
    assert shared.store == url


def rule(defects: str, form: str = REDIS_FORM) -> str:
    """What follows the quoted value in the message of an invalid store URL."""
    return f"is not a valid store URL: {defects}; store must be {form}"


@pytest.mark.parametrize(
    ("value", "shown", "says"),
    [
        (
            "http://:s3cret-pw@10.0.0.5",
            "'http://:<redacted>@10.0.0.5'",
            rule("it does not start with redis://, rediss:// or unix://", EVERY_FORM),
        ),
        (
            "10.0.0.5:6379",
            "'10.0.0.5:6379'",
            rule("it does not start with redis://, rediss:// or unix://", EVERY_FORM),
        ),
        ("redis://:s3cret-pw@", "'redis://:<redacted>@'", rule("it has no host")),
        (
            "redis://:s3cret-pw@10.0.0.5:0/0",
            "'redis://:<redacted>@10.0.0.5:0/0'",
            rule("its port '0' is not a number from 1 to 65535"),
        ),
        (
            "redis://:s3cret-pw@10.0.0.5:99999",
            "'redis://:<redacted>@10.0.0.5:99999'",
            rule("its port '99999' is not a number from 1 to 65535"),
        ),
        (
            "redis://:s3cret-pw@10.0.0.5/one",
            "'redis://:<redacted>@10.0.0.5/one'",
            rule("its database 'one' is not an integer >= 0"),
        ),
        (
            "redis://:s3cret-pw@10.0.0.5/-1",
            "'redis://:<redacted>@10.0.0.5/-1'",
            rule("its database '-1' is not an integer >= 0"),
        ),
        (
            "redis://:s3cret-pw@10.0.0.5/0?db=1",
            "'redis://:<redacted>@10.0.0.5/0?db=1'",
            rule("it gives the database twice (in the path and as ?db=)"),
        ),
        (
            "redis://:s3cret-pw@10.0.0.5/0?timeout=5&db=0",
            "'redis://:<redacted>@10.0.0.5/0?timeout=<redacted>&db=0'",
            rule(
                "its query parameter 'timeout' is not supported (only db is) and it gives the "
                "database twice (in the path and as ?db=)",
            ),
        ),
        (
            "rediss://:s3cret-pw@10.0.0.5#main",
            "'rediss://:<redacted>@10.0.0.5#<redacted>'",
            rule("it has a fragment (#...)", "rediss://[[USER]:PASSWORD@]HOST[:PORT][/DB]"),
        ),
        (
            "redis://:s3cret pw@10.0.0.5",
            "'redis://:<redacted>@10.0.0.5'",
            rule("it contains whitespace"),
        ),
        (
            "redis://:s3cret/pw@10.0.0.5:6379/0",
            "'redis://:<redacted>@10.0.0.5:6379/0'",
            rule(
                "an '@' follows its host part, so a '/', '?' or '#' in its password ended "
                "the host part early (percent-encode them in the password: %2F, %3F, %23)",
            ),
        ),
        (
            "redis://:s3cret?pw@10.0.0.5",
            "'redis://:<redacted>@10.0.0.5'",
            rule(
                "an '@' follows its host part, so a '/', '?' or '#' in its password ended "
                "the host part early (percent-encode them in the password: %2F, %3F, %23)",
            ),
        ),
        (
            "redis://:s3cret-pw@:x/y",
            "'redis://:<redacted>@:x/y'",
            rule(
                "it has no host, its port 'x' is not a number from 1 to 65535 and its database "
                "'y' is not an integer >= 0",
            ),
        ),
        (
            "unix://:s3cret-pw@run/redis.sock",
            "'unix://:<redacted>@run/redis.sock'",
            rule(
                "it names a host ('run'), which a unix:// URL cannot have (write three "
                "slashes: unix:///run/redis.sock)",
                UNIX_FORM,
            ),
        ),
        ("unix://", "'unix://'", rule("it has no socket path", UNIX_FORM)),
        (
            "unix:run/redis.sock",
            "'unix:run/redis.sock'",
            rule("its socket path 'run/redis.sock' is not absolute", UNIX_FORM),
        ),
        (
            "unix:///run/redis.sock?db=x&db=1",
            "'unix:///run/redis.sock?db=x&db=1'",
            rule("it gives ?db= twice and its database 'x' is not an integer >= 0", UNIX_FORM),
        ),
    ],
)
def test_an_invalid_store_url_is_refused_naming_each_defect_and_the_form(
    value: str, shown: str, says: str
) -> None:
    """Each defect of the URL is named in one sentence, with the form the scheme takes; the
    value is quoted with its password hidden."""
    message = problem_at(with_shared(store=value), STORE)
    assert message == f"{shown} {says}"
    assert "s3cret" not in message


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (
            999,
            "999 is below 1000; lease_ttl_ms must be >= 1000 (each lease is renewed every "
            "third of it)",
        ),
        (0, "0 is below 1000; lease_ttl_ms must be >= 1000"),
        (
            600_001,
            "600001 is above 600000; lease_ttl_ms must be <= 600000 (a dead edge's leases "
            "hold their slots that long)",
        ),
        ("10000", "'10000' is invalid: input should be a valid integer"),
        (True, "True is invalid: input should be a valid integer"),
        (1.5, "1.5 is invalid: input should be a valid integer"),
    ],
)
def test_a_lease_ttl_outside_1_s_to_10_min_is_refused(value: object, says: str) -> None:
    message = problem_at(with_shared(store="redis://h", lease_ttl_ms=value), f"{PATH}.lease_ttl_ms")
    assert message.startswith(says)


@pytest.mark.parametrize("ttl", [1000, 600_000])
def test_the_bounds_of_the_lease_ttl_are_accepted(ttl: int) -> None:
    shared = load(with_shared(store="redis://h", lease_ttl_ms=ttl)).provider_pool.shared
    assert shared is not None
    assert shared.lease_ttl_ms == ttl


def test_an_unknown_store_down_mode_is_refused_naming_the_two() -> None:
    message = problem_at(
        with_shared(store="redis://h", on_store_down="wait"), f"{PATH}.on_store_down"
    )
    assert message == "'wait' is not allowed; on_store_down must be 'static_split' or 'reject'"


def test_shared_without_a_store_is_refused() -> None:
    assert problem_at(with_shared(lease_ttl_ms=5000), STORE) == "required key 'store' is missing"


def test_an_unknown_key_in_shared_is_refused_with_the_closest_one() -> None:
    message = problem_at(with_shared(store="redis://h", lease_ttl=5000), f"{PATH}.lease_ttl")
    assert message == "unknown key 'lease_ttl'; did you mean 'lease_ttl_ms'?"


def test_every_problem_of_the_section_is_reported_at_once() -> None:
    doc = with_shared(store="redis://", lease_ttl_ms=5, on_store_down="queue")
    doc["provider_pool"]["max_queue"] = -1
    found = {p.path for p in problems(doc)}
    assert {STORE, f"{PATH}.lease_ttl_ms", f"{PATH}.on_store_down", "provider_pool.max_queue"} <= (
        found
    )


def test_the_section_must_be_a_mapping() -> None:
    doc = base_doc()
    doc["provider_pool"]["shared"] = "redis://h"
    assert "is invalid" in problem_at(doc, PATH)


# --- ${VAR} in the URL --------------------------------------------------------------------


def test_the_password_comes_from_the_environment_and_is_recorded_as_a_secret() -> None:
    doc = with_shared(store="redis://:${REDIS_PASSWORD}@10.0.0.5:6379/0")
    config = load(doc, env={"REDIS_PASSWORD": "pw-from-env"})
    assert config.provider_pool.shared is not None
    assert config.provider_pool.shared.store == "redis://:pw-from-env@10.0.0.5:6379/0"
    assert config.provenance.values == {"pw-from-env"}


def test_a_missing_variable_is_one_problem_naming_it_at_the_store() -> None:
    doc = with_shared(store="redis://:${REDIS_PASSWORD}@10.0.0.5:6379/0")
    assert [(p.path, p.message) for p in problems(doc, env={})] == [
        (
            STORE,
            "environment variable REDIS_PASSWORD is not set; set it in the daemon's environment "
            "(for example in the file of iop-edge serve --env-file) or write "
            "${REDIS_PASSWORD:-default}",
        )
    ]


def test_a_password_from_the_environment_that_breaks_the_url_is_never_quoted() -> None:
    """A password holding '/' (base64) must be percent-encoded: the problem says so, and the
    password is not in it, not even in part."""
    doc = with_shared(store="redis://:${REDIS_PASSWORD}@10.0.0.5:6379/0")
    [problem] = problems(doc, env={"REDIS_PASSWORD": "abc/defgh+ij="})
    assert problem.path == STORE
    assert "percent-encode" in problem.message
    assert "abc" not in problem.message
    assert "defgh" not in problem.message


# --- refresh classes ----------------------------------------------------------------------


def refreshed(
    before: dict[str, Any], after: dict[str, Any], env: dict[str, str] | None = None
) -> RefreshOutcome:
    """Refresh ``before`` (loaded) against ``after`` (as YAML text), applying the live part."""
    return refresh(load(before, env), yaml.safe_dump(after), mode="apply", env=env)


def test_a_changed_store_is_restart_class_says_why_and_is_not_applied() -> None:
    before = with_shared(store="redis://10.0.0.5:6379/0")
    after = with_shared(store="redis://10.0.0.6:6379/0")
    outcome = refreshed(before, after)
    assert outcome.result.result == "restart_required"
    [entry] = outcome.result.report
    assert (entry.path, entry.change_class, entry.applied) == (STORE, "restart", False)
    assert (entry.old, entry.new) == ("redis://10.0.0.5:6379/0", "redis://10.0.0.6:6379/0")
    assert entry.reason == RESTART_REASONS[STORE]
    assert "opens its connection to the store when it starts" in entry.reason
    assert outcome.running.provider_pool.shared == load(before).provider_pool.shared


@pytest.mark.parametrize("direction", ["added", "removed"])
def test_adding_or_removing_shared_is_one_restart_entry_that_says_why(direction: str) -> None:
    local, shared = base_doc(), with_shared(store="redis://:pw@10.0.0.5:6379/0", lease_ttl_ms=2000)
    before, after = (local, shared) if direction == "added" else (shared, local)
    outcome = refreshed(before, after)
    assert outcome.result.result == "restart_required"
    [entry] = outcome.result.report
    section = {
        "store": "redis://:<redacted>@10.0.0.5:6379/0",
        "lease_ttl_ms": 2000,
        "on_store_down": "static_split",
    }
    expected = (None, section) if direction == "added" else (section, None)
    assert (entry.path, entry.change_class, entry.applied) == (PATH, "restart", False)
    assert (entry.old, entry.new) == expected
    assert entry.reason == RESTART_REASONS[PATH]
    # what runs keeps its pool as it was, local or shared, until the restart
    assert outcome.running.provider_pool.shared == load(before).provider_pool.shared
    assert pool_policy(outcome.running).shared == shared_policy(load(before).provider_pool.shared)


@pytest.mark.parametrize(
    ("field", "value"), [("lease_ttl_ms", 30_000), ("on_store_down", "reject")]
)
def test_the_lease_ttl_and_the_store_down_mode_are_live(field: str, value: object) -> None:
    before = with_shared(store="redis://10.0.0.5")
    after = with_shared(store="redis://10.0.0.5", **{field: value})
    outcome = refreshed(before, after)
    assert (outcome.result.result, outcome.result.errors) == ("applied", [])
    [entry] = outcome.result.report
    assert (entry.path, entry.change_class, entry.applied, entry.new, entry.reason) == (
        f"{PATH}.{field}",
        "live",
        True,
        value,
        None,
    )
    assert "reason" not in outcome.result.to_json()["report"][0]
    policy = pool_policy(outcome.running).shared
    assert policy is not None
    assert getattr(policy, field) == value


def test_a_live_change_with_a_new_store_applies_the_live_part_and_keeps_the_old_store() -> None:
    before = with_shared(store="redis://10.0.0.5")
    after = with_shared(store="redis://10.0.0.6", lease_ttl_ms=4000, on_store_down="reject")
    after["provider_pool"]["max_queue"] = 4
    outcome = refreshed(before, after)
    assert outcome.result.result == "restart_required"
    assert [(e.path, e.change_class, e.applied) for e in outcome.result.report] == [
        ("provider_pool.max_queue", "live", True),
        (f"{PATH}.lease_ttl_ms", "live", True),
        (f"{PATH}.on_store_down", "live", True),
        (STORE, "restart", False),
    ]
    running = outcome.running.provider_pool
    assert running.shared == SharedSection(
        store="redis://10.0.0.5", lease_ttl_ms=4000, on_store_down="reject"
    )
    assert running.max_queue == 4
    # what is left against the candidate is the restart entry alone
    assert [e.path for e in classify(outcome.running, load(after)).entries] == [STORE]


def test_an_unchanged_shared_section_is_no_change() -> None:
    doc = with_shared(store="redis://:${PW}@10.0.0.5", lease_ttl_ms=3000)
    outcome = refreshed(doc, copy.deepcopy(doc), env={"PW": "same"})
    assert (outcome.result.result, outcome.result.report) == ("applied", [])


# --- the pool's policy --------------------------------------------------------------------


def test_the_policy_carries_the_live_fields_and_never_the_store() -> None:
    doc = with_shared(store="redis://:pw@10.0.0.5", lease_ttl_ms=1500, on_store_down="reject")
    policy = pool_policy(load(doc))
    assert policy.shared == SharedPolicy(lease_ttl_ms=1500, on_store_down="reject")
    assert policy.shared.lease_ttl_s == 1.5
    assert [f.name for f in dataclasses.fields(SharedPolicy)] == ["lease_ttl_ms", "on_store_down"]
    assert "pw" not in repr(policy)


def test_shared_policy_is_frozen_and_checks_its_values() -> None:
    policy = SharedPolicy()
    assert (policy.lease_ttl_ms, policy.on_store_down) == (10_000, "static_split")
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.lease_ttl_ms = 5  # type: ignore[misc]
    assert not hasattr(policy, "__dict__")  # slots
    with pytest.raises(ValueError, match="lease_ttl_ms 0 is below 1"):
        SharedPolicy(lease_ttl_ms=0)
    with pytest.raises(ValueError, match="on_store_down 'wait' is not one of"):
        SharedPolicy(on_store_down="wait")  # type: ignore[arg-type]


def test_a_pool_policy_is_local_unless_told() -> None:
    policy = PoolPolicy(max_queue=1, queue_timeout_ms=0, providers=(), groups={})
    assert policy.shared is None
