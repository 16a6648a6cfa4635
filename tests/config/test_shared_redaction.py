"""The password of ``provider_pool.shared.store`` is never shown: not by ``config show``,
``config validate`` or ``config refresh``, not in a problem's message, a refresh report, the
``config_refresh`` log line, ``/admin/status``'s config part or a repr — written in the file
or taken from the environment, percent-encoded or not."""

from __future__ import annotations

import asyncio
import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from iop_edge.cli import format_status, main
from iop_edge.cli.render import format_refresh
from iop_edge.config import ConfigError, dump_config, parse_config
from iop_edge.config.redact import REDACTED, redact, redact_store_url
from iop_edge.config.refresh import refresh
from iop_edge.runtime.logs import get_logger
from iop_edge.supervisor import RefreshRecord, Supervisor
from tests.helpers.config import load, with_shared
from tests.helpers.hand_source import HandSource

SECRET = "Sup3r-Secret-PW"
ROTATED = "R0tated-Secret-PW"
FROM_ENV = "redis://:${REDIS_PASSWORD}@10.0.0.5:6379/0"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw@10.0.0.5:6379/0", "redis://:<redacted>@10.0.0.5:6379/0"),
        ("rediss://edge:pw@h:6380", "rediss://edge:<redacted>@h:6380"),
        ("redis://token-as-user@h", "redis://<redacted>@h"),
        ("redis://:p/w?x#y@h:6379/0", "redis://:<redacted>@h:6379/0"),
        ("redis://:p'w\"x y@h", "redis://:<redacted>@h"),
        ("redis://:p@w@h", "redis://:<redacted>@h"),
        ("unix://:pw@/run/redis.sock?db=2", "unix://:<redacted>@/run/redis.sock?db=2"),
        ("unix:///run/redis@1.sock?db=0", "unix:///run/redis@1.sock?db=0"),
        ("redis://h/0?password=pw&db=1", "redis://h/0?password=<redacted>&db=1"),
        ("redis://h#frag", "redis://h#<redacted>"),
        ("redis://10.0.0.5:6379/0", "redis://10.0.0.5:6379/0"),
    ],
)
def test_a_store_url_is_shown_with_its_password_hidden_whatever_it_holds(
    url: str, shown: str
) -> None:
    """Cut at the last '@', not parsed: a password that is not percent-encoded is hidden
    whole; the database number stays readable."""
    assert redact_store_url(url) == shown
    assert redact(url, "store") == shown
    assert redact({"shared": {"store": url}}) == {"shared": {"store": shown}}


def test_the_section_shows_its_store_redacted_and_no_repr_holds_the_password() -> None:
    config = load(with_shared(store=f"redis://:{SECRET}@10.0.0.5:6379/0"))
    shared = config.provider_pool.shared
    assert shared is not None
    assert shared.store_redacted == "redis://:<redacted>@10.0.0.5:6379/0"
    for text in (repr(shared), repr(config.provider_pool), repr(config), str(config)):
        assert SECRET not in text


# --- the command line ---------------------------------------------------------------------


def write(path: Path, doc: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump(doc))
    return str(path)


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_PASSWORD", SECRET)


@pytest.mark.parametrize("form", [(), ("--json",)], ids=["yaml", "json"])
@pytest.mark.parametrize(
    "store", [f"redis://:{SECRET}@10.0.0.5:6379/0", FROM_ENV], ids=["in-file", "from-env"]
)
def test_config_show_prints_the_store_with_its_password_redacted(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    secret_env: None,
    store: str,
    form: tuple[str, ...],
) -> None:
    file = write(tmp_path / "edge.yaml", with_shared(store=store, lease_ttl_ms=3000))
    assert main(["config", "show", file, *form]) == 0
    out = capsys.readouterr().out
    assert SECRET not in out
    shown = (json.loads(out) if form else yaml.safe_load(out))["provider_pool"]["shared"]
    assert shown == {
        "store": f"redis://:{REDACTED}@10.0.0.5:6379/0",
        "lease_ttl_ms": 3000,
        "on_store_down": "static_split",
    }


@pytest.mark.parametrize("form", [(), ("--json",)], ids=["text", "json"])
@pytest.mark.parametrize(
    "store",
    [
        f"redis://:{SECRET}@10.0.0.5:6379/x",
        f"redis://:{SECRET}/x@10.0.0.5:6379/0",
        "redis://:${REDIS_PASSWORD}@:6379/x",
        "redis://:${REDIS_PASSWORD}/x@10.0.0.5",
        "http://:${REDIS_PASSWORD}@10.0.0.5",
    ],
)
def test_config_validate_names_the_problem_never_the_password(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    secret_env: None,
    store: str,
    form: tuple[str, ...],
) -> None:
    file = write(tmp_path / "edge.yaml", with_shared(store=store))
    assert main(["config", "validate", file, *form]) == 1
    captured = capsys.readouterr()
    printed = captured.out + captured.err
    assert "provider_pool.shared.store" in printed
    assert "is not a valid store URL" in printed
    assert SECRET[:6] not in printed


def test_config_validate_of_a_valid_shared_config_prints_no_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], secret_env: None
) -> None:
    file = write(tmp_path / "edge.yaml", with_shared(store=FROM_ENV))
    assert main(["config", "validate", file, "--json"]) == 0
    assert SECRET not in capsys.readouterr().out


@pytest.mark.parametrize("form", [(), ("--json",)], ids=["table", "json"])
@pytest.mark.parametrize(
    ("before", "after"),
    [
        (f"redis://:{SECRET}@10.0.0.5:6379/0", f"redis://:{ROTATED}@10.0.0.6:6379/0"),
        (FROM_ENV, FROM_ENV.replace("10.0.0.5", "10.0.0.6")),
    ],
    ids=["in-file", "from-env"],
)
def test_config_refresh_reports_a_new_store_redacted_with_its_reason(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    secret_env: None,
    before: str,
    after: str,
    form: tuple[str, ...],
) -> None:
    """The old password and the new one stay hidden; the change is reported, restart-class,
    with why."""
    running = write(tmp_path / "running.yaml", with_shared(store=before))
    candidate = write(tmp_path / "candidate.yaml", with_shared(store=after))
    args = ["config", "refresh", "--offline", running, "--candidate", candidate, *form]
    assert main(args) == 3  # restart required
    out = capsys.readouterr().out
    assert SECRET not in out
    assert ROTATED not in out
    if form:
        [entry] = json.loads(out)["report"]
        assert entry == {
            "path": "provider_pool.shared.store",
            "class": "restart",
            "old": f"redis://:{REDACTED}@10.0.0.5:6379/0",
            "new": f"redis://:{REDACTED}@10.0.0.6:6379/0",
            "applied": False,
            "reason": entry["reason"],
        }
        assert "opens its connection to the store when it starts" in entry["reason"]
    else:
        assert "provider_pool.shared.store needs a restart: the edge opens its connection" in out


# --- the daemon's log line and status -----------------------------------------------------


async def test_the_refresh_log_line_and_the_status_never_show_the_password(
    tmp_path: Path, log_stream: io.StringIO
) -> None:
    """A running edge whose store password comes from its environment sees a candidate with
    a new store (a new literal password): the ``config_refresh`` line, the last refresh and
    ``restart_pending`` in the status, and its text rendering, hold neither password."""
    env = {"REDIS_PASSWORD": SECRET}
    running = load(with_shared(store=FROM_ENV), env=env)
    path = tmp_path / "edge.yaml"
    candidate = yaml.safe_dump(with_shared(store=f"redis://:{ROTATED}@10.0.0.6:6379/0"))
    source = HandSource(path, candidate)
    supervisor = Supervisor(
        path, running, apply=lambda config: None, env=env, log=get_logger(), source=source
    )
    supervisor.start()
    records: asyncio.Queue[RefreshRecord] = asyncio.Queue()
    supervisor.add_listener(records.put_nowait)
    try:
        result = await supervisor.refresh("api")
        await asyncio.wait_for(records.get(), timeout=15)
        status = supervisor.statistics().as_status()
    finally:
        await supervisor.stop()
    assert result.result == "restart_required"
    [pending] = status["restart_pending"]
    assert pending["path"] == "provider_pool.shared.store"
    assert pending["old"] == f"redis://:{REDACTED}@10.0.0.5:6379/0"
    assert pending["new"] == f"redis://:{REDACTED}@10.0.0.6:6379/0"
    assert "opens its connection to the store" in pending["reason"]
    text = format_status(
        {
            "edge": "e",
            "config": status,
            "queue": {"depth": 0, "max_queue": 16, "queue_timeout_ms": 30000},
            "providers": [],
            "counters": {"admitted": 0, "released": 0, "rejected": {}},
        }
    )
    assert "provider_pool.shared.store: redis://:<redacted>@10.0.0.5:6379/0 ->" in text
    logged = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    [line] = [x for x in logged if x["event"] == "config_refresh"]
    [change] = line["changes"]
    assert (change["path"], change["class"]) == ("provider_pool.shared.store", "restart")
    assert "opens its connection to the store" in change["reason"]
    for shown in (json.dumps(status), text, log_stream.getvalue()):
        assert SECRET not in shown
        assert ROTATED not in shown


# --- any password -------------------------------------------------------------------------

#: Passwords of every kind: the characters that end a URL's parts ('/', '?', '#', '@', ':'),
#: quotes, spaces, '%', '$', other scripts. Framed by 'Q' and 'Z', which nothing else shown
#: holds: a piece of a password that leaked is found by its first or last character.
passwords = st.text(
    alphabet=st.sampled_from("abc123/?#@:%'\" $[]=&.-\\") | st.characters(codec="utf-8"),
    min_size=2,
    max_size=16,
).map(lambda text: f"Q{text}Z")


def everything_shown(doc: dict[str, Any], after: dict[str, Any], env: dict[str, str]) -> str:
    """All a person can be shown of a config and of a refresh to ``after``: the problems
    when it does not load; else ``config show``'s data, the refresh report as JSON and as a
    table, and the section's redacted store (JSON without escapes: a leak stays readable)."""
    try:
        config = parse_config(copy.deepcopy(doc), env=env)
    except ConfigError as exc:
        return "\n".join(str(p) for p in exc.problems)
    outcome = refresh(config, yaml.safe_dump(after), env=env, mode="apply")
    assert config.provider_pool.shared is not None
    return "\n".join(
        [
            json.dumps(redact(dump_config(config)), ensure_ascii=False),
            json.dumps(outcome.result.to_json(), ensure_ascii=False),
            format_refresh(outcome.result),
            config.provider_pool.shared.store_redacted,
        ]
    )


@given(
    password=passwords,
    from_env=st.booleans(),
    user=st.sampled_from(["", "edge"]),
    rest=st.sampled_from(["10.0.0.5:6379/0", "/run/redis.sock?db=1"]),
)
def test_no_password_or_piece_of_one_is_ever_shown(
    password: str, from_env: bool, user: str, rest: str
) -> None:
    """Whatever the password, raw (not percent-encoded), in the file or from the
    environment, with a user name or none, and whether or not the URL then loads: neither
    it nor a piece of it that starts or ends it is in anything shown."""
    scheme = "unix://" if rest.startswith("/") else "redis://"
    written = "${REDIS_PASSWORD}" if from_env else password.replace("$", "$$")  # '$' is '$$'
    store = f"{scheme}{user}:{written}@{rest}"
    env = {"REDIS_PASSWORD": password} if from_env else {}
    doc = with_shared(store=store)
    after = with_shared(store=store.replace("10.0.0.5", "10.0.0.6").replace("redis.", "r."))
    shown = everything_shown(doc, after, env)
    assert "Q" not in shown
    assert "Z" not in shown
