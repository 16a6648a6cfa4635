"""The bounds of a config through real processes (issue 10, items 1, 6 and 9): ``iop-edge config
validate`` refuses every hostile file with one clear line and exit 1, never a traceback or a
hang; the daemon's refresh path (its :class:`Supervisor`) rejects the same file with the same
``path: message``; ``config show`` and ``config refresh`` never print a secret.

Every command runs under a timeout and a 1 GiB address-space limit, so a regression (a blocking
read of a FIFO, an expanding alias bomb) fails its test instead of hanging the run or the
machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from iop_edge.config import load_config
from iop_edge.config.limits import MAX_DEPTH
from iop_edge.config.redact import REDACTED
from iop_edge.config.refresh import RefreshResult
from iop_edge.config_file import MAX_FILE_BYTES
from iop_edge.runtime.logs import Logger
from iop_edge.supervisor import Supervisor
from tests.helpers.config import MINIMAL_YAML, base_doc, node
from tests.helpers.limits import (
    DEEP,
    DEPTH_RULE,
    INT_RULE,
    NEXT_LINE,
    NODE_RULE,
    SECRET_ARGS,
    SECRET_URL,
    SECRETS,
    SHOWN_ARGS,
    SHOWN_URL,
    alias_bomb,
    call_within,
    nested_list,
    nested_mapping,
    with_priority,
)

IOP_EDGE = str(Path(sys.executable).with_name("iop-edge"))
#: Virtual memory a command may map (KiB for ulimit -v); `config validate` needs about 100 MiB.
MEMORY_KIB = 1024 * 1024


def run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """``iop-edge ARGS`` under the memory limit; a command still running after ``timeout``
    seconds is killed and the test fails (subprocess.TimeoutExpired)."""
    return subprocess.run(
        ["sh", "-c", f'ulimit -v {MEMORY_KIB} && exec "$0" "$@"', IOP_EDGE, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@contextlib.contextmanager
def unblocking(path: Path) -> Iterator[None]:
    """On the way out, open a FIFO at ``path`` for writing (if a reader waits), so a regressed
    reader blocked in open() gets EOF and its thread ends."""
    try:
        yield
    finally:
        if path.is_fifo():
            with contextlib.suppress(OSError):
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def write_text(text: str) -> Callable[[Path], object]:
    return lambda path: path.write_text(text)


def write_bytes(data: bytes) -> Callable[[Path], object]:
    return lambda path: path.write_bytes(data)


NON_UTF8 = MINIMAL_YAML.encode() + b"# caf\xe9\n"  # Latin-1, as an editor might save it
NON_UTF8_AT = NON_UTF8.index(b"\xe9")
OVERSIZE = MINIMAL_YAML.encode() + b"#" * (MAX_FILE_BYTES - len(MINIMAL_YAML) + 1)

#: Hostile files: how to make one at a path, and the one line `config validate` prints for it.
HOSTILE: dict[str, tuple[Callable[[Path], object], Callable[[Path], str]]] = {
    "deep-mapping": (
        write_text(MINIMAL_YAML + f"x-deep: {nested_mapping(DEEP)}\n"),
        lambda _: (
            "x-deep" + ".a" * (MAX_DEPTH - 1) + f": is nested more than {MAX_DEPTH} "
            f"levels deep (line {NEXT_LINE}); {DEPTH_RULE}"
        ),
    ),
    "deep-list": (
        write_text(MINIMAL_YAML + f"x-deep: {nested_list(DEEP)}\n"),
        lambda _: (
            "x-deep" + "[0]" * (MAX_DEPTH - 1) + f": is nested more than {MAX_DEPTH} "
            f"levels deep (line {NEXT_LINE}); {DEPTH_RULE}"
        ),
    ),
    "big-int": (
        write_text(with_priority(2**64)),
        lambda _: f"nodes[local].providers[cat].priority: {2**64} is too large; {INT_RULE}",
    ),
    "alias-bomb": (
        write_text(MINIMAL_YAML + alias_bomb(9)),
        lambda _: f"x-lol6: {NODE_RULE}",
    ),
    "recursive-alias": (
        write_text(MINIMAL_YAML + "x-loop: &loop [*loop]\n"),
        lambda _: (
            f"x-loop[0]: is a recursive alias (line {NEXT_LINE} refers to a node that "
            "contains it); a config cannot be recursive"
        ),
    ),
    "non-utf8": (
        write_bytes(NON_UTF8),
        lambda path: (
            f"{path}: not valid UTF-8 at byte {NON_UTF8_AT} (line "
            f"{NEXT_LINE}, byte 0xe9); save the file as UTF-8"
        ),
    ),
    "oversize": (
        write_bytes(OVERSIZE),
        lambda path: (
            f"cannot read config {path}: it is {len(OVERSIZE):,} bytes; a config file "
            f"may be at most 4 MiB ({MAX_FILE_BYTES:,} bytes)"
        ),
    ),
    "fifo": (
        os.mkfifo,
        lambda path: f"cannot read config {path}: it is a FIFO (named pipe), not a regular file",
    ),
    "directory": (
        Path.mkdir,
        lambda path: f"cannot read config {path}: it is a directory, not a regular file",
    ),
}


@pytest.fixture(params=list(HOSTILE))
def hostile(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A hostile config file and the one problem line it must be refused with."""
    make, line = HOSTILE[request.param]
    path = tmp_path / "edge.yaml"
    make(path)
    with unblocking(path):
        yield path, line(path)


def test_config_validate_refuses_a_hostile_file_with_one_line_and_exit_1(hostile):
    path, line = hostile
    result = run("config", "validate", str(path))
    assert "Traceback" not in result.stderr
    assert (result.returncode, result.stdout, result.stderr.splitlines()) == (1, "", [line])


class RecordingLog:
    """A structlog-like logger keeping every event (the supervisor logs internal failures)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Callable[..., None]:
        return lambda event, **fields: self.events.append((level, event, fields))


def daemon_refresh(path: Path) -> tuple[RefreshResult, RecordingLog]:
    """A dry-run refresh of ``path`` by the daemon's :class:`Supervisor` (as the admin API asks
    for one), running ``MINIMAL_YAML``. Its event loop runs in a bounded thread: a supervisor
    that reads a FIFO on its loop (as one did) must fail the test, not hang it."""
    log = RecordingLog()

    async def judge() -> RefreshResult:
        running = load_config(MINIMAL_YAML)
        recorder = cast(Logger, log)  # records calls by level: all a Supervisor makes
        supervisor = Supervisor(path, running, apply=lambda config: None, env={}, log=recorder)
        return await supervisor.refresh("api", "dry_run")

    return call_within(60, asyncio.run, judge()), log


def test_config_validate_and_the_daemons_refresh_path_agree_on_a_hostile_file(hostile):
    path, line = hostile
    cli = run("config", "validate", "--json", str(path))
    assert cli.returncode == 1
    shown = json.loads(cli.stdout)
    # The command's own answer first: a loader that expands an alias bomb must not be run
    # again inside this process.
    assert shown["valid"] is False
    assert [
        f"{e['path']}: {e['message']}" if e["path"] else e["message"] for e in shown["errors"]
    ] == [line]
    result, log = daemon_refresh(path)
    assert result.result == "rejected"
    assert [{"path": e.path, "message": e.message} for e in result.errors] == shown["errors"]
    # A clean rejection, not an exception caught by the supervisor's safety net.
    assert log.events == []


def test_without_libyaml_text_nested_too_deep_is_still_a_config_error(tmp_path):
    # PyYAML's pure-Python composer recurses: it overflows a few hundred levels down, where
    # libyaml would have stopped at 1000. Such an install must refuse the file all the same.
    path = tmp_path / "edge.yaml"
    path.write_text(MINIMAL_YAML + f"x-deep: {nested_list(DEEP)}\n")
    script = (
        "import sys, yaml; del yaml.CSafeLoader; from iop_edge.cli import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, "config", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (result.returncode, result.stderr.splitlines()) == (
        1,
        [f"{path}: the document is nested too deep to parse; {DEPTH_RULE}"],
    )


# --- secrets (item 9) --------------------------------------------------------------------------


def secret_doc() -> dict[str, Any]:
    """base_doc with a password and a key in a base_url and secrets in cli arguments, on an
    adapter and as a provider's override."""
    doc = base_doc()
    vllm, _, shell = node(doc)["adapters"]
    vllm["base_url"] = SECRET_URL
    shell["args"] = SECRET_ARGS
    node(doc)["providers"][0]["base_url"] = SECRET_URL
    return doc


def assert_no_secret(output: str) -> None:
    assert [s for s in SECRETS if s in output] == []


def test_config_show_redacts_url_userinfo_query_and_secret_cli_args(tmp_path):
    path = tmp_path / "edge.yaml"
    path.write_text(yaml.safe_dump(secret_doc()))
    as_json = run("config", "show", "--json", str(path))
    as_yaml = run("config", "show", str(path))
    for result in (as_json, as_yaml):
        assert (result.returncode, result.stderr) == (0, "")
        assert_no_secret(result.stdout)
    shown = json.loads(as_json.stdout)
    assert yaml.safe_load(as_yaml.stdout) == shown
    adapters = {a["name"]: a for a in shown["nodes"][0]["adapters"]}
    assert adapters["vllm-main"]["base_url"] == SHOWN_URL
    assert adapters["shell"]["args"] == SHOWN_ARGS
    assert shown["nodes"][0]["providers"][0]["base_url"] == SHOWN_URL


def test_config_validate_does_not_quote_a_refused_secret(tmp_path):
    doc = base_doc()
    vllm, _, shell = node(doc)["adapters"]
    vllm["base_url"] = SECRET_URL.replace("https", "ftp")
    shell["args"] = " ".join(SECRET_ARGS)  # one string instead of a list
    path = tmp_path / "edge.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = run("config", "validate", str(path))
    assert_no_secret(result.stdout + result.stderr)
    shown_ftp = SHOWN_URL.replace("https", "ftp")
    assert (result.returncode, result.stderr.splitlines()) == (
        1,
        [
            f"nodes[gpu-1].adapters[vllm-main].base_url: {shown_ftp!r} is not an http(s) URL; "
            "base_url must start with http://",
            f"nodes[gpu-1].adapters[shell].args: {REDACTED} (str) is invalid: input should be a "
            "valid tuple",
        ],
    )


def test_config_refresh_offline_reports_secrets_redacted(tmp_path):
    running = tmp_path / "running.yaml"
    running.write_text(yaml.safe_dump(base_doc()))
    candidate = tmp_path / "edge.yaml"
    candidate.write_text(yaml.safe_dump(secret_doc()))
    for fmt in ((), ("--json",)):
        result = run(
            "config", "refresh", "--offline", str(running), "--config", str(candidate), *fmt
        )
        assert (result.returncode, result.stderr) == (3, "")  # restart required
        assert_no_secret(result.stdout)
        assert REDACTED in result.stdout
    report = {e["path"]: e["new"] for e in json.loads(result.stdout)["report"]}
    assert report["nodes[gpu-1].adapters[vllm-main].base_url"] == SHOWN_URL
    assert report["nodes[gpu-1].adapters[shell].args"] == SHOWN_ARGS
    assert report["nodes[gpu-1].providers[vllm-a].base_url"] == SHOWN_URL
