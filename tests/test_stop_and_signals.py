"""Stopping and signals (issue 10, items 8 and 9).

- The whole stop is bounded once by ``--drain-timeout``: requests still running at the cut log
  ``503 drain_timeout`` and the process exits 0 within the timeout, not twice it; a drain that
  finishes early exits at once. The shipped unit gives systemd's kill room for that.
- SIGHUP never kills the daemon: not while it starts, not while it stops.
- An internal error logs where it happened (a rendered traceback, never ``"exc_info": true``)
  and never the request's content or its token.

The subprocess tests run ``iop-edge serve`` next to this interpreter, as systemd would; they
read its JSON log (stderr) and synchronise on its events. Real-time values are bounds that make
a broken run fail instead of hang, except where the bound itself is the rule under test (the
drain) and the pacing of the SIGHUP bursts.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import linecache
import math
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from iop_edge.adapters.base import Executor, UpstreamCall, UpstreamReply, UpstreamStream
from iop_edge.adapters.cli_process import KILL_GRACE_SECONDS
from iop_edge.adapters.registry import NodeAdapters
from iop_edge.cli import build_parser
from iop_edge.config import parse_config
from iop_edge.daemon import Daemon, cancel_reserve
from iop_edge.options import ServeOptions
from iop_edge.runtime.logs import configure_logging, flush_logs
from iop_edge.supervisor import SupervisorOptions
from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from iop_edge.tokens import new_token, token_hash
from tests.helpers import BOUND, IOP_EDGE, ROOT, doc_for, dump, wait_for
from tests.helpers.service import (
    HUP_PACE,
    STARTUP,
    chat,
    events,
    served,
    third_party_code_loaded,
    unit_settings,
    write_config,
)

CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=BOUND)


async def queue_depth_reaches(session: aiohttp.ClientSession, console: str, depth: int) -> None:
    """Poll ``/admin/status`` until the queue holds ``depth`` requests (bounded)."""
    async with asyncio.timeout(BOUND):
        while True:
            async with session.get(console + "/admin/status") as response:
                if (await response.json())["queue"]["depth"] >= depth:
                    return
            await asyncio.sleep(0.01)


# --- item 8: the drain is bounded once by --drain-timeout --------------------------------------

# The drain runs on the event loop's own clock (Daemon.stop), not on an injected one, so these
# tests measure real time. Each upper bound is the rule under test plus the slack stated below
# (figures measured on the 2-core development machine); each lower bound is the rule exactly:
# the cut comes no earlier than the drain timeout less its cancellation reserve.

EXIT_SLACK = 1.0
"""How much longer than ``--drain-timeout`` ``iop-edge serve`` may take from SIGTERM to its
exit when the drain runs out. Measured: 1.54-1.57 s for a timeout of 2 s (the cut at 1.5 s,
the timeout less its 0.5 s cancellation reserve; the cut requests end and the process exits
within 0.07 s of it). Over that the bound leaves the unused reserve and a second for a loaded
machine (the interpreter's exit, the thread that waits for it), and still tells the rule from
the stop it replaced, twice the timeout (4 s)."""

EARLY_EXIT_BOUND = 5.0
"""Seconds ``iop-edge serve`` may take to exit once the last request of a drain that finished
early is answered. Measured: 0.04-0.07 s. The failure it catches waits out the drain timeout
(30 s in that test); the bound sits between the two, some 70 times the real figure for a
loaded machine and a sixth of the timeout."""

STOP_SLACK = 0.5
"""How much longer than its ``drain_timeout`` ``Daemon.stop()`` may take, in process, when the
drain runs out. Measured: 1.13 s for a timeout of 1.5 s (the cut at 1.125 s, the timeout less
its 0.375 s cancellation reserve; the cut requests end at once). Over that the bound leaves the
unused reserve and half a second for a loaded machine; no process has to exit here, hence less
than :data:`EXIT_SLACK`."""


async def test_sigterm_cuts_a_drain_that_runs_out_within_the_drain_timeout_once(tmp_path):
    """``serve --drain-timeout 2`` with one request held by the upstream and one queued behind
    it: SIGTERM → both are cut before the timeout (their clients see the connection closed,
    their request lines say ``503 drain_timeout``, the upstream call is aborted), a
    ``drain_timeout`` warning counts the 2 cut connections, and the process exits 0 within
    the drain timeout plus a second (before issue 10 it took twice the timeout)."""
    drain = 2.0
    async with FakeOpenAI(behavior=FakeBehavior(hold=True)) as fake:
        config = write_config(tmp_path, doc_for(fake, capacity=1))
        with served(config, "--drain-timeout", f"{drain:g}") as daemon:
            listening = daemon.wait_event("listening", STARTUP)
            async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session:
                in_flight = asyncio.create_task(chat(session, listening["openai"]))
                await fake.wait_in_flight(1)
                queued = asyncio.create_task(chat(session, listening["openai"]))
                await queue_depth_reaches(session, listening["console"], 1)
                signalled = time.monotonic()
                daemon.process.send_signal(signal.SIGTERM)
                outcomes = await asyncio.gather(in_flight, queued, return_exceptions=True)
                code = await asyncio.to_thread(daemon.exit_code)
                elapsed = time.monotonic() - signalled
                await fake.wait_until(lambda: fake.cancelled == 1)
    assert code == 0, daemon.log
    assert elapsed < drain + EXIT_SLACK, (
        f"the stop took {elapsed:.2f} s for --drain-timeout {drain:g}"
    )
    assert elapsed >= drain - cancel_reserve(drain)  # the requests had until the cut to finish
    for outcome in outcomes:  # cut: the connection closes without an answer
        assert isinstance(outcome, aiohttp.ClientConnectionError), outcome
    draining = daemon.events("draining")
    assert [(e["in_flight"], e["queued"], e["timeout_s"]) for e in draining] == [(1, 1, drain)]
    cut = daemon.events("drain_timeout")
    assert [(e["listener"], e["cut"], e["timeout_s"]) for e in cut] == [("openai", 2, drain)]
    requests = daemon.events("request")
    assert [(r["status"], r["code"], r["model"]) for r in requests] == [
        (503, "drain_timeout", "chat"),
        (503, "drain_timeout", "chat"),
    ]
    stopped = daemon.events()[-1]
    assert (stopped["event"], stopped["in_flight"], stopped["queued"]) == ("stopped", 0, 0)
    assert fake.total_requests == 1  # the queued one never reached the upstream


async def test_a_drain_that_finishes_early_answers_everything_and_exits_at_once(tmp_path):
    """``serve --drain-timeout 30`` with one request held and one queued: SIGTERM, then the
    upstream answers. Both requests are served 200 (the queued one during the drain), nothing
    is cut, and the process exits 0 right after — not at the end of the drain timeout."""
    drain = 30.0
    async with FakeOpenAI(behavior=FakeBehavior(hold=True)) as fake:
        config = write_config(tmp_path, doc_for(fake, capacity=1))
        with served(config, "--drain-timeout", f"{drain:g}") as daemon:
            listening = daemon.wait_event("listening", STARTUP)
            async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session:
                in_flight = asyncio.create_task(chat(session, listening["openai"]))
                await fake.wait_in_flight(1)
                queued = asyncio.create_task(chat(session, listening["openai"]))
                await queue_depth_reaches(session, listening["console"], 1)
                daemon.process.send_signal(signal.SIGTERM)
                await asyncio.to_thread(daemon.wait_event, "draining")
                fake.behavior = FakeBehavior()  # the queued one is answered without a hold
                released = time.monotonic()
                fake.release()
                answers = await asyncio.gather(in_flight, queued)
                code = await asyncio.to_thread(daemon.exit_code)
                elapsed = time.monotonic() - released
    assert code == 0, daemon.log
    assert [(status, body["choices"][0]["message"]["content"]) for status, body in answers] == [
        (200, "hello edge"),
        (200, "hello edge"),
    ]
    assert elapsed < EARLY_EXIT_BOUND, f"exited {elapsed:.2f} s after the last request finished"
    assert not daemon.has_logged("drain_timeout")
    assert [(r["status"], r["code"]) for r in daemon.events("request")] == [(200, "ok")] * 2
    assert daemon.events()[-1]["event"] == "stopped"


async def test_daemon_stop_is_bounded_by_its_drain_timeout_and_releases_every_slot(log_stream):
    """In process: ``Daemon(drain_timeout=1.5)`` with one request held upstream and one queued;
    ``stop()`` returns within the timeout plus half a second, both requests are cut (503
    ``drain_timeout`` in their request lines), and every slot is released."""
    drain = 1.5
    async with FakeOpenAI(behavior=FakeBehavior(hold=True)) as fake:
        daemon = Daemon(parse_config(doc_for(fake, capacity=1)), ServeOptions(drain_timeout=drain))
        await daemon.start()
        try:
            async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session:
                base = daemon.openai_url.removesuffix("/v1")
                in_flight = asyncio.create_task(chat(session, base))
                await fake.wait_in_flight(1)
                queued = asyncio.create_task(chat(session, base))
                await wait_for(lambda: daemon.scheduler.statistics().queue_depth == 1)
                loop = asyncio.get_running_loop()
                started = loop.time()
                await daemon.stop()
                elapsed = loop.time() - started
                outcomes = await asyncio.gather(in_flight, queued, return_exceptions=True)
        finally:
            if daemon.listeners:  # stop() failed half-way: don't leak the sockets
                await daemon.stop()
        await fake.wait_until(lambda: fake.cancelled == 1)
    assert elapsed < drain + STOP_SLACK, f"stop() took {elapsed:.2f} s for drain_timeout={drain:g}"
    assert elapsed >= drain - cancel_reserve(drain)  # the requests had until the cut to finish
    assert all(isinstance(o, aiohttp.ClientConnectionError) for o in outcomes), outcomes
    log = log_stream.getvalue()
    assert [(e["cut"], e["timeout_s"]) for e in events(log, "drain_timeout")] == [(2, drain)]
    assert [(r["status"], r["code"]) for r in events(log, "request")] == [
        (503, "drain_timeout")
    ] * 2
    stats = daemon.scheduler.statistics()
    assert (stats.in_flight, stats.queue_depth, stats.double_releases) == (0, 0, 0)
    assert stats.admitted == stats.released
    assert fake.total_requests == 1  # the queued one never reached the upstream


# --- item 8: the unit's numbers ---------------------------------------------------------------

UNIT = ROOT / "deploy/iop-edge.service"

_TIMESPAN_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0}
_TIMESPAN_UNITS |= {"h": 3600.0, "hr": 3600.0}


def timespan_seconds(value: str) -> float:
    """A systemd time span (``45``, ``45s``, ``1min 30s``, ``infinity``) in seconds; a bare
    number is seconds, as for ``TimeoutStopSec=``."""
    if value == "infinity":
        return math.inf
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value)
    # Every character is part of a number or a unit: nothing was skipped unread.
    assert "".join(n + u for n, u in parts) == value.replace(" ", ""), value
    return sum(float(number) * _TIMESPAN_UNITS[unit or "s"] for number, unit in parts)


def test_the_units_stop_timeout_outlasts_the_drain_timeout_and_a_kill_grace():
    """systemd kills the daemon ``TimeoutStopSec`` after SIGTERM. The longest stop the daemon
    takes is ``--drain-timeout`` (the whole stop is bounded by it once), plus at most one CLI
    kill grace when agent process groups cancelled at the cut linger (``Daemon.stop``): the
    unit must leave that much, read from the command line ``ExecStart`` really runs — change
    one number without the other and this fails."""
    settings = unit_settings(UNIT.read_text())
    assert settings["Service.KillSignal"] == ["SIGTERM"]
    [exec_start] = settings["Service.ExecStart"]
    argv = shlex.split(exec_start)
    assert Path(argv[0]).name == "iop-edge"
    args = build_parser().parse_args(argv[1:])
    assert args.command == "serve"
    drain = args.drain_timeout
    [timeout_stop] = settings["Service.TimeoutStopSec"]
    stop = timespan_seconds(timeout_stop)
    assert stop > drain + KILL_GRACE_SECONDS, (
        f"TimeoutStopSec={timeout_stop} leaves systemd killing the daemon before "
        f"--drain-timeout {drain:g} s plus the CLI kill grace {KILL_GRACE_SECONDS:g} s are over"
    )


def test_systemd_reads_the_units_stop_timeout_as_this_test_does(tmp_path):
    """``systemd-analyze verify`` accepts the unit and ``systemd-analyze timespan`` reads its
    ``TimeoutStopSec`` as :func:`timespan_seconds` does (skipped without systemd-analyze)."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed on this machine")
    text = UNIT.read_text()
    local = tmp_path / "iop-edge.service"  # verify checks that ExecStart's program exists
    local.write_text(text.replace("/opt/iop-edge/bin/iop-edge", IOP_EDGE))
    verify = subprocess.run(
        ["systemd-analyze", "verify", str(local)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert verify.returncode == 0, verify.stderr
    assert "iop-edge.service" not in verify.stderr
    [timeout_stop] = unit_settings(text)["Service.TimeoutStopSec"]
    span = subprocess.run(
        ["systemd-analyze", "timespan", timeout_stop],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    micros = re.search(r"μs: (\d+)", span.stdout)
    assert micros is not None, span.stdout
    assert int(micros.group(1)) / 1e6 == timespan_seconds(timeout_stop)


# --- item 9: SIGHUP never kills the daemon ---------------------------------------------------


def test_sighup_while_the_daemon_starts_is_remembered_not_fatal(tmp_path):
    """SIGHUP every 5 ms from the moment ``iop-edge serve`` starts importing its libraries until
    it logs ``listening`` (before issue 10 the first ~0.4 s of imports ran with Python's default
    action, which ends the process): it stays up, reaches ``listening``, the early signals give
    a refresh triggered by ``signal``, and SIGTERM still exits 0.

    The burst starts once a third-party extension module is mapped, not at ``Popen``: the
    interpreter's own start, before any code of the package runs, is the one window no Python
    program can cover (:mod:`iop_edge.runtime.signals`)."""
    config = write_config(tmp_path, doc_for())
    with served(config, "--no-parent") as daemon:  # (the parent's part: tests/test_parent.py)
        pid = daemon.process.pid
        deadline = time.monotonic() + STARTUP
        while not third_party_code_loaded(pid) and daemon.process.poll() is None:
            assert time.monotonic() < deadline, "the daemon never started importing"
            time.sleep(0.0005)
        sent = 0
        while not daemon.has_logged("listening") and daemon.process.poll() is None:
            assert time.monotonic() < deadline, "the daemon did not start:\n" + daemon.log
            daemon.process.send_signal(signal.SIGHUP)
            sent += 1
            time.sleep(HUP_PACE)
        assert daemon.process.poll() is None, (
            f"the daemon died (exit code {daemon.process.poll()}) after {sent} SIGHUP(s) while "
            "starting:\n" + daemon.log
        )
        assert sent >= 10, "the burst did not overlap the start-up: the test proves nothing"
        refresh = daemon.wait_event("config_refresh")
        assert (refresh["trigger"], refresh["result"]) == ("signal", "applied")
        daemon.process.send_signal(signal.SIGTERM)
        assert daemon.exit_code() == 0, daemon.log
    assert {(e["trigger"], e["result"]) for e in daemon.events("config_refresh")} == {
        ("signal", "applied")
    }
    assert daemon.events()[-1]["event"] == "stopped"


def test_sigusr2_while_the_daemon_starts_is_logged_and_ignored_not_fatal(tmp_path):
    """SIGUSR2 (a restart) while ``iop-edge serve`` imports its libraries (before issue 25 its
    default action ended the process, exit -12): the daemon starts, logs that a restart signal
    arrived while it was starting and that it is ignored, hands nothing over, and SIGTERM
    exits 0. The server alone (``--no-parent``): its own early handler is under test.

    Sent once a third-party extension module is mapped (see the SIGHUP test above); a start
    so fast that ``listening`` came first is tried again, a few times."""
    config = write_config(tmp_path, doc_for())
    for _ in range(3):
        with served(config, "--no-parent") as daemon:
            pid = daemon.process.pid
            deadline = time.monotonic() + STARTUP
            while not third_party_code_loaded(pid) and daemon.process.poll() is None:
                assert time.monotonic() < deadline, "the daemon never started importing"
                time.sleep(0.0005)
            if daemon.has_logged("listening"):
                continue  # too late to test the start: again
            daemon.process.send_signal(signal.SIGUSR2)
            daemon.wait_event("listening", STARTUP)
            ignored = daemon.wait_event("restart_signal_ignored")
            alive = daemon.process.poll() is None
            daemon.process.send_signal(signal.SIGTERM)
            code = daemon.exit_code()
            break
    else:
        pytest.fail("the daemon logged 'listening' before each signal could be sent")
    assert alive, daemon.log
    assert (ignored["signal"], ignored["phase"]) == ("SIGUSR2", "starting")
    assert "while the daemon was starting" in ignored["message"]
    assert "send it again" in ignored["message"]
    assert not daemon.has_logged("handed_over")
    assert code == 0, daemon.log


def test_sighup_while_the_daemon_stops_is_not_fatal(tmp_path):
    """SIGTERM, then SIGHUP every 5 ms until the process is gone: the stop runs to its end and
    the exit code is 0 (before issue 10 SIGHUP got its default action back while the daemon
    stopped, and a reload at that moment ended it with a signal)."""
    config = write_config(tmp_path, doc_for())
    with served(config) as daemon:
        daemon.wait_event("listening", STARTUP)
        daemon.process.send_signal(signal.SIGTERM)
        sent = 0
        deadline = time.monotonic() + BOUND
        while daemon.process.poll() is None:
            assert time.monotonic() < deadline, "the daemon did not stop:\n" + daemon.log
            daemon.process.send_signal(signal.SIGHUP)
            sent += 1
            time.sleep(HUP_PACE)
        code = daemon.exit_code()
    assert code == 0, f"exit code {code} after {sent} SIGHUP(s) while stopping:\n{daemon.log}"
    assert sent >= 1
    assert daemon.events()[-1]["event"] == "stopped"


# --- item 9: internal errors log a traceback, never the request ---------------------------------


class BrokenExecutor:
    """A provider adapter with a bug: it fails with an error quoting the request body."""

    native_apis: frozenset[str] = frozenset()

    async def complete(self, call: UpstreamCall) -> UpstreamReply:
        """Raise (the message quotes the request, as careless error messages do)."""
        raise ValueError(f"cannot encode {call.body!r}")

    async def open_stream(self, call: UpstreamCall) -> UpstreamStream | UpstreamReply:
        """Raise, as :meth:`complete`."""
        raise ValueError(f"cannot encode {call.body!r}")

    async def count_tokens(
        self, chat_body: dict[str, Any], target: str, headers: Mapping[str, str], request_id: str
    ) -> int | None:
        """Cannot count (as an upstream without a tokenizer)."""
        return None


class BrokenAdapters(NodeAdapters):
    """Every provider and route of the edge served by :class:`BrokenExecutor` (no node's
    adapters are built, so there is nothing to close)."""

    def __init__(self) -> None:
        super().__init__({})

    def provider(self, node_id: str, provider_id: str) -> Executor:
        """The broken executor."""
        return BrokenExecutor()

    def route(self, node_id: str, adapter: str) -> Executor:
        """The broken executor."""
        return BrokenExecutor()


def frame_points_at_a_raise(frame: str) -> bool:
    """Whether ``FILE:LINE in FUNCTION`` names a line of this file that raises."""
    location, _, _ = frame.partition(" in ")
    path, _, line = location.rpartition(":")
    return path == __file__ and "raise " in linecache.getline(path, int(line))


@contextlib.asynccontextmanager
async def running(daemon: Daemon) -> AsyncIterator[Daemon]:
    """``daemon`` started, and stopped afterwards."""
    await daemon.start()
    try:
        yield daemon
    finally:
        await daemon.stop()


@pytest.mark.parametrize("stream", [False, True])
async def test_an_internal_error_in_a_request_logs_its_frames_never_the_request(log_stream, stream):
    """A provider adapter raises an unexpected exception whose message quotes the request:
    the client gets a 500 ``internal_error`` envelope with its ``x-request-id``; the log's
    ``request_failed`` line for that id names the exception type and carries the frames down
    to the line that raised — not ``"exc_info": true`` — and no log line holds the prompt or
    the client's token."""
    token = new_token()
    secret = "confidential prompt 7f3a9c"
    doc = doc_for()
    doc["openai"] |= {
        "principal_tokens": [
            {
                "token_ref": "app",
                "token_hash_sha256": token_hash(token),
                "principal_ref": "team-a",
            }
        ]
    }
    daemon = Daemon(parse_config(doc))
    daemon.server.adapters = BrokenAdapters()
    async with (
        running(daemon),
        aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session,
        session.post(
            daemon.openai_url + "/chat/completions",
            json={
                "model": "echo",
                "stream": stream,
                "messages": [{"role": "user", "content": secret}],
            },
            headers={"Authorization": f"Bearer {token}"},
        ) as response,
    ):
        status, body = response.status, await response.json()
        request_id = response.headers["x-request-id"]
    assert status == 500
    assert body["error"]["code"] == "internal_error"
    assert secret not in json.dumps(body)
    log = log_stream.getvalue()
    assert "exc_info" not in log
    assert secret not in log
    assert token not in log
    [failed] = events(log, "request_failed")
    assert (failed["request_id"], failed["level"]) == (request_id, "error")
    assert failed["error_type"] == "ValueError"
    assert frame_points_at_a_raise(failed["traceback"][-1]), failed["traceback"]
    [line] = events(log, "request")
    assert (line["request_id"], line["status"], line["code"]) == (request_id, 500, "internal_error")


async def test_an_internal_error_in_a_refresh_logs_its_traceback(log_stream, tmp_path):
    """The refresh's classifier raises (a bug): the admin refresh answers ``rejected`` with a
    reason, and the ``config_refresh_failed`` line carries the rendered traceback down to the
    line that raised — not ``"exc_info": true``."""

    def classify(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the classifier has a bug")

    path = tmp_path / "edge.yaml"
    path.write_text(dump(doc_for()))
    daemon = Daemon(
        parse_config(doc_for()),
        ServeOptions(
            config_path=path, watch=False, supervisor_options=SupervisorOptions(classify=classify)
        ),
    )
    async with (
        running(daemon),
        aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session,
        session.post(daemon.console_url + "/admin/config/refresh?mode=apply") as response,
    ):
        status, result = response.status, await response.json()
    assert (status, result["result"]) == (200, "rejected")
    assert "internal error (RuntimeError: the classifier has a bug)" in json.dumps(result)
    log = log_stream.getvalue()
    [failed] = events(log, "config_refresh_failed")
    rendered = failed["exception"]
    assert rendered.startswith("Traceback (most recent call last):")
    assert rendered.rstrip().endswith("RuntimeError: the classifier has a bug")
    raised_at = re.findall(r'File "([^"]+)", line (\d+), in (\w+)', rendered)[-1]
    assert (raised_at[0], raised_at[2]) == (__file__, "classify")
    assert "raise " in linecache.getline(__file__, int(raised_at[1]))
    assert "exc_info" not in log


@pytest.mark.parametrize("fmt", ["json", "console"])
async def test_a_library_error_is_logged_with_its_traceback(fmt):
    """asyncio reports a callback that raised through the stdlib ``logging`` module with the
    exception attached; the structured log renders the traceback (the JSON ``exception``
    field, or below the console line) — never ``exc_info: true``."""
    stream = io.StringIO()
    configure_logging("info", fmt, stream)
    ran = asyncio.Event()

    def callback() -> None:
        ran.set()
        raise KeyError("lost")

    asyncio.get_running_loop().call_soon(callback)
    await ran.wait()  # resumes after the loop has handled (and logged) the callback's error
    flush_logs()
    text = stream.getvalue()
    if fmt == "json":
        [line] = [e for e in events(text) if "exception" in e]
        assert line["level"] == "error"
        assert line["logger"] == "asyncio"
        text = line["exception"]
    assert "Traceback (most recent call last):" in text
    assert re.search(rf'File "{re.escape(__file__)}", line \d+, in callback', text)
    assert "KeyError: 'lost'" in text
    assert "exc_info" not in stream.getvalue()
