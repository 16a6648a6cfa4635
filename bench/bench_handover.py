"""Benchmark: 20 zero-downtime restarts ("handovers") in a row under load (issue 14).

What it measures: whether ``POST /admin/restart`` (docs/operations.md, "Restarts without a gap")
hands the daemon over to a new process, again and again while clients keep it busy, without a
failed request, a refused connection or a slot over a provider's capacity; and how long one
handover takes.

The scenario: ``iop-edge serve`` as a subprocess on a generated config, model ``chat`` on two
fake OpenAI-compatible upstreams (:class:`~iop_edge.testing.fake_openai.FakeOpenAI`, in
process), each a provider of ``--capacity`` slots (2); each answer after ``--latency`` s (0.05),
streamed chunks ``--chunk-delay`` s (0.01) apart. One principal token; ``max_queue`` 256 and
``queue_timeout_ms`` 60000, so nothing is refused for capacity. Clients are aiohttp (one
session, kept-alive connections): ``--loops`` (16) loops of non-streaming chat requests and
``--stream-loops`` (4) loops of streaming ones, each sending its next request as soon as the
previous one is answered, for the whole run.

1. After a warm-up of ``--warmup`` s (1), ``--handovers`` (20) restarts in a row. Each: ``POST
   {console}/admin/restart`` (its round trip timed) must answer ``handed_over``; then
   ``GET {console}/admin/status``, each over a new connection, until it shows the new pid;
   then ``--pause`` s (0.2) so that the new process is under load before the next restart.
2. The load stops; every client loop ends. Every old process must then exit (bounded wait,
   ``--exit-timeout`` s, 30): it leaves once its last request ended. The last process gets
   SIGTERM and must exit too. Whatever happens (Ctrl-C and SIGTERM included), every
   ``iop-edge`` process the bench learned of, and any child of one, is SIGKILLed at the end,
   so no daemon outlives it.

A request counts as a failure on any status but 200, an answer that is not the echo of its
prompt, a stream that did not end with ``data: [DONE]``, or an exception; a refused
connection (``ECONNREFUSED``) is a failure and is also counted apart. Each failure is listed
with when it was sent and when it failed and the handovers it overlapped. "max in-flight" is
the most requests each upstream ran at once (the fake's own count; a client that gives up frees
its slot before the upstream's handler sees the cancellation, so a short ``--request-timeout``
can show one over). The handover time comes from two sources: the client's
round trip of ``POST /admin/restart`` and the old process's ``handed_over`` log line
(``duration_ms``: from starting the new process to the hand-over done). Two more rows come
from the log: what the old processes did with their requests after handing over
(``handover_drained``: finished there, relayed to the new process, cut) and the most slots a
new process counted as inherited (``handover_taken``). The daemons' JSON logs (the first one's
stderr, which every successor inherits) go to a temporary file, removed after a passing run
(unless ``--keep-log``) and kept, its path printed, otherwise.

Prints a Markdown table, then one JSON line. Expected: no failure, no refused connection, max
in-flight at most the capacity, a handover in well under 2 s at the median (mostly the new
interpreter's start-up), no old process left running.

Usage::

    .venv/bin/python bench/bench_handover.py
    .venv/bin/python bench/bench_handover.py --handovers 50 --json bench/results/handover.json

Exit status 0 when every target is met — no failure, no refused connection, every handover
``handed_over``, every stream complete, max in-flight never over the capacity, p50 of the
handover round trip under 2 s, no old process left running and the last one stopped by
SIGTERM — else 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from iop_edge.testing.leaks import children_of
from iop_edge.tokens import token_hash

IOP_EDGE = str(Path(sys.executable).with_name("iop-edge"))
TOKEN = "iop_bench-token-of-the-handover-app"
JSON_BODY = {"Content-Type": "application/json"}
MAX_P50_S = 2.0
STARTUP_S = 30.0
"""Seconds the first daemon may take to log ``listening``."""
SERVING_S = 30.0
"""Seconds a new process may take to show its pid in ``/admin/status`` after ``handed_over``."""


def config(upstreams: list[str], capacity: int) -> dict[str, Any]:
    """Model ``chat`` on one provider of ``capacity`` slots per upstream; one token."""
    names = [f"up-{n}" for n in range(1, len(upstreams) + 1)]
    return {
        "openai": {
            "listen": "127.0.0.1:0",
            "principal_tokens": [
                {"token_ref": "app", "token_hash_sha256": token_hash(TOKEN), "principal_ref": "app"}
            ],
        },
        "metrics": {"listen": "127.0.0.1:0"},
        "console": {"listen": "127.0.0.1:0"},
        "logging": {"level": "info", "format": "json"},
        "provider_pool": {"max_queue": 256, "queue_timeout_ms": 60000},
        "models": [{"id": "chat", "context_window_tokens": 8192, "providers": names}],
        "nodes": [
            {
                "id": "local",
                "adapters": [
                    {"name": f"oa-{name}", "type": "openai_compat", "base_url": url}
                    for name, url in zip(names, upstreams, strict=True)
                ],
                "providers": [
                    {
                        "id": name,
                        "type": "openai_compat",
                        "category": "api",
                        "adapter": f"oa-{name}",
                        "models": ["fake-model"],
                        "capacity": capacity,
                    }
                    for name in names
                ],
            }
        ],
    }


def log_events(log_path: Path, name: str | None = None) -> list[dict[str, Any]]:
    """The JSON events of every daemon's log so far (those named ``name``)."""
    found = []
    for line in log_path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict) and (name is None or event.get("event") == name):
                found.append(event)
    return found


async def listening(log_path: Path, daemon: subprocess.Popen[bytes]) -> dict[str, Any]:
    """The first daemon's ``listening`` event (its listeners' URLs)."""
    async with asyncio.timeout(STARTUP_S):
        while True:
            if daemon.poll() is not None:
                raise RuntimeError(f"iop-edge exited: {log_path.read_text()[-2000:]}")
            events = log_events(log_path, "listening")
            if events:
                return events[0]
            await asyncio.sleep(0.05)


def refused(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a refused connection."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ConnectionRefusedError):
            return True
        if isinstance(current, aiohttp.ClientConnectorError):
            if current.os_error.errno == errno.ECONNREFUSED:
                return True
        elif isinstance(current, OSError) and current.errno == errno.ECONNREFUSED:
            return True
        current = current.__cause__ or current.__context__
    return False


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (it may not be our child)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("State:"):
            return line.split()[1] not in ("Z", "X")
    return True


def is_iop_edge(pid: int) -> bool:
    """Whether process ``pid`` runs ``iop-edge`` (so that a reused pid is never killed)."""
    try:
        return b"iop-edge" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


async def exited(pids: list[int], timeout: float) -> list[int]:
    """Wait until none of ``pids`` runs, at most ``timeout`` s; those still running."""
    deadline = time.monotonic() + timeout
    while True:
        left = [pid for pid in pids if running(pid)]
        if not left or time.monotonic() >= deadline:
            return left
        await asyncio.sleep(0.05)


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q`` percentile of ``values`` (NaN when empty)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


@dataclass
class Handover:
    """One restart: when it was asked, answered and seen serving, and what it answered."""

    index: int
    asked: float
    answered: float = float("nan")
    serving: float = float("nan")
    result: str = ""
    message: str = ""
    pid: int | None = None

    @property
    def round_trip_ms(self) -> float:
        return (self.answered - self.asked) * 1000


@dataclass
class Failure:
    """One failed request: when it was sent and when it failed (seconds since the load
    started), its kind (``refused``, the exception's type, ``HTTP 503``, ...) and detail."""

    started: float
    ended: float
    kind: str
    detail: str


@dataclass
class Load:
    """The client loops' counts; times are seconds since ``origin``."""

    url: str
    origin: float
    requests: int = 0
    ok: int = 0
    refused: int = 0
    streams_started: int = 0
    streams_completed: int = 0
    failures: list[Failure] = field(default_factory=list)

    def now(self) -> float:
        return time.perf_counter() - self.origin

    async def ask(self, session: aiohttp.ClientSession, text: str, *, stream: bool) -> None:
        """One chat request; counted, and recorded when it failed."""
        body = {"model": "chat", "messages": [{"role": "user", "content": text}], "stream": stream}
        headers = {"Authorization": f"Bearer {TOKEN}"}
        self.requests += 1
        self.streams_started += stream
        started = self.now()
        try:
            async with session.post(
                self.url + "/v1/chat/completions", json=body, headers=headers
            ) as response:
                answer = await response.text()
                status = response.status
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            self.refused += refused(exc)
            kind = "refused" if refused(exc) else type(exc).__name__
            self.fail(started, kind, f"{text!r}: {type(exc).__name__}: {exc!r}")
            return
        if status != 200:
            self.fail(started, f"HTTP {status}", f"{text!r}: {answer[:300]}")
        elif stream and "data: [DONE]" not in answer:
            self.fail(started, "incomplete stream", f"{text!r}: ...{answer[-300:]}")
        elif not stream and not self.echoes(answer, text):
            self.fail(started, "wrong answer", f"{text!r}: {answer[:300]}")
        else:
            self.ok += 1
            self.streams_completed += stream

    def fail(self, started: float, kind: str, detail: str) -> None:
        self.failures.append(Failure(started, self.now(), kind, detail))

    @staticmethod
    def echoes(answer: str, text: str) -> bool:
        try:
            return bool(json.loads(answer)["choices"][0]["message"]["content"] == text)
        except (ValueError, KeyError, IndexError, TypeError):
            return False

    async def loop(
        self, session: aiohttp.ClientSession, n: int, stop: asyncio.Event, *, stream: bool
    ) -> None:
        """Ask again as soon as answered, until ``stop``."""
        kind = "stream" if stream else "chat"
        i = 0
        while not stop.is_set():
            await self.ask(session, f"{kind} {n}.{i}", stream=stream)
            i += 1


async def admin(console: str, method: str, path: str, timeout: float) -> tuple[int, dict[str, Any]]:
    """One admin request over a new connection (a kept-alive one may reach an old process)."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
        session.request(method, console + path, headers=JSON_BODY) as response,
    ):
        return response.status, dict(await response.json(content_type=None))


async def serving_pid(console: str, pid: int, errors: list[str], origin: float) -> bool:
    """Poll ``/admin/status`` until it shows ``pid`` (at most :data:`SERVING_S` s)."""
    deadline = time.monotonic() + SERVING_S
    while time.monotonic() < deadline:
        try:
            status, answer = await admin(console, "GET", "/admin/status", 10)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            at = time.perf_counter() - origin
            errors.append(f"t={at:.2f}s GET /admin/status: {type(exc).__name__}: {exc}")
        else:
            if status == 200 and answer.get("pid") == pid:
                return True
        await asyncio.sleep(0.02)
    return False


async def hand_over(
    args: argparse.Namespace,
    console: str,
    load: Load,
    done: list[Handover],
    admin_errors: list[str],
) -> None:
    """``--handovers`` restarts in a row, each waited for until the new process serves; each
    appended to ``done`` as it starts (so that an interrupted run knows its pids)."""
    for index in range(1, args.handovers + 1):
        handover = Handover(index, load.now())
        done.append(handover)
        try:
            status, answer = await admin(console, "POST", "/admin/restart", 90)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            handover.answered = load.now()
            handover.result = "error"
            handover.message = f"{type(exc).__name__}: {exc}"
            admin_errors.append(f"t={handover.asked:.2f}s POST /admin/restart: {exc!r}")
            await asyncio.sleep(1)  # a broken daemon: the next one may still work
            continue
        handover.answered = load.now()
        handover.result = str(answer.get("result", f"HTTP {status}"))
        handover.message = str(answer.get("message", ""))
        if handover.result != "handed_over":
            await asyncio.sleep(args.pause)
            continue
        handover.pid = int(answer["pid"])
        if await serving_pid(console, handover.pid, admin_errors, load.origin):
            handover.serving = load.now()
        else:
            handover.message = f"/admin/status did not show pid {handover.pid} in {SERVING_S} s"
        await asyncio.sleep(args.pause)


def stop_all(pids: list[int]) -> None:
    """SIGKILL every ``iop-edge`` process of ``pids`` still running, and their descendants
    (a new process still starting is a child of the old one, not yet known by pid)."""
    found: list[int] = []
    todo = list(pids)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.append(pid)
            todo += children_of(pid)
    for pid in found:
        if running(pid) and is_iop_edge(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def learned_pids(first: int, handovers: list[Handover], log_path: Path) -> list[int]:
    """Every daemon pid the bench knows of: the first, those answered, those in the log."""
    pids = [first]
    pids += [h.pid for h in handovers if h.pid is not None]
    with contextlib.suppress(OSError):
        pids += [int(e["pid"]) for e in log_events(log_path, "handed_over") if "pid" in e]
    return list(dict.fromkeys(pids))


def during(failure: Failure, handovers: list[Handover]) -> str:
    """The handovers a failed request overlapped (from the POST to the new pid serving, and
    1 s more), or ``between handovers``."""
    found = []
    for h in handovers:
        end = h.serving if h.serving == h.serving else h.answered
        if failure.started <= end + 1.0 and h.asked <= failure.ended:
            found.append(
                f"handover {h.index}: POST {h.asked:.2f}s, answered {h.answered:.2f}s, "
                f"serving {end:.2f}s"
            )
    return "; ".join(found) or "between handovers"


async def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The scenario: daemon, load, handovers, stop; the figures."""
    behavior = FakeBehavior(latency=args.latency, chunk_delay=args.chunk_delay)
    async with FakeOpenAI(behavior=behavior) as one, FakeOpenAI(behavior=behavior) as two:
        fakes = [one, two]
        path = work / "edge.yaml"
        doc = config([fake.base_url for fake in fakes], args.capacity)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        log_path = work / "edge.log"
        with open(log_path, "ab") as log:  # O_APPEND: every process writes whole lines
            daemon = subprocess.Popen(
                # the server alone: each old process exits, the first is our child
                [IOP_EDGE, "serve", "--config", str(path), "--drain-timeout", "10", "--no-parent"],
                stderr=log,
            )
        handovers: list[Handover] = []
        admin_errors: list[str] = []
        left_running: list[int] = []
        last_stopped = False
        first_exit: int | None = None
        try:
            urls = await listening(log_path, daemon)
            load = Load(str(urls["openai"]), time.perf_counter())
            stop = asyncio.Event()
            timeout = aiohttp.ClientTimeout(total=args.request_timeout)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                loops = [
                    asyncio.create_task(load.loop(session, n, stop, stream=False))
                    for n in range(args.loops)
                ] + [
                    asyncio.create_task(load.loop(session, n, stop, stream=True))
                    for n in range(args.stream_loops)
                ]
                await asyncio.sleep(args.warmup)
                await hand_over(args, str(urls["console"]), load, handovers, admin_errors)
                stop.set()
                await asyncio.gather(*loops)
            load_end = load.now()
            pids = learned_pids(daemon.pid, handovers, log_path)
            serving = pids[-1]
            left_running = await exited(pids[:-1], args.exit_timeout)  # zombies have exited
            if running(serving):
                os.kill(serving, signal.SIGTERM)
                last_stopped = not await exited([serving], args.exit_timeout)
            first_exit = daemon.poll()  # the first daemon is our child: reaped here
        finally:
            stop_all(learned_pids(daemon.pid, handovers, log_path))
            if daemon.poll() is None:
                daemon.kill()
            daemon.wait()
    return figures(
        args,
        load,
        load_end,
        handovers,
        log_events(log_path),
        fakes,
        admin_errors,
        left_running,
        last_stopped,
        first_exit,
        log_path,
    )


def figures(
    args: argparse.Namespace,
    load: Load,
    load_end: float,
    handovers: list[Handover],
    events: list[dict[str, Any]],
    fakes: list[FakeOpenAI],
    admin_errors: list[str],
    left_running: list[int],
    last_stopped: bool,
    first_exit: int | None,
    log_path: Path,
) -> dict[str, Any]:
    """The report of one run (``events``: every daemon's log)."""
    handed = {int(e["pid"]): e for e in events if e.get("event") == "handed_over" and "pid" in e}
    taken = [e for e in events if e.get("event") == "handover_taken"]
    drained = [e for e in events if e.get("event") == "handover_drained"]
    ok = [h for h in handovers if h.result == "handed_over" and h.serving == h.serving]
    round_trips = [h.round_trip_ms for h in ok]
    logged = [float(handed[h.pid]["duration_ms"]) for h in ok if h.pid in handed]

    def times(values: list[float]) -> dict[str, float]:
        return {
            "p50": round(percentile(values, 50), 1),
            "p95": round(percentile(values, 95), 1),
            "max": round(max(values, default=float("nan")), 1),
        }

    return {
        "requests": load.requests,
        "requests_ok": load.ok,
        "requests_per_s": round(load.requests / load_end, 1) if load_end else 0.0,
        "failures": len(load.failures),
        "refused_connections": load.refused,
        "failures_by_kind": dict(Counter(f.kind for f in load.failures).most_common()),
        "failures_during_handovers": sum(
            during(f, handovers) != "between handovers" for f in load.failures
        ),
        "failure_examples": [
            f"sent t={f.started:.2f}s, failed t={f.ended:.2f}s [{during(f, handovers)}] "
            f"{f.kind} {f.detail}"
            for f in load.failures[:20]
        ],
        "streams_started": load.streams_started,
        "streams_completed": load.streams_completed,
        "handovers_ok": len(ok),
        "handovers": len(handovers),
        "handover_problems": [
            f"handover {h.index} at t={h.asked:.2f}s: {h.result} {h.message}".strip()
            for h in handovers
            if h not in ok
        ],
        "admin_errors": admin_errors[:20],
        "max_in_flight": [fake.max_in_flight for fake in fakes],
        "capacity": args.capacity,
        "round_trip_ms": times(round_trips),
        "handed_over_duration_ms": times(logged),
        "handed_over_logged": len(logged),
        "inherited_leases_max": max((int(e["inherited_leases"]) for e in taken), default=0),
        "old_finished": sum(int(e.get("finished", 0)) for e in drained),
        "old_relayed": sum(int(e.get("relayed", 0)) for e in drained),
        "old_cut": sum(int(e.get("cut", 0)) for e in drained),
        "handover_drained_logged": len(drained),
        "old_processes_left_running": len(left_running),
        "old_pids_left_running": left_running,
        "first_exit_code": first_exit,
        "last_stopped_by_sigterm": last_stopped,
        "log": str(log_path),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--handovers", type=int, default=20, help="restarts in a row")
    parser.add_argument("--loops", type=int, default=16, help="non-streaming client loops")
    parser.add_argument("--stream-loops", type=int, default=4, help="streaming client loops")
    parser.add_argument("--capacity", type=int, default=2, help="slots of each upstream")
    parser.add_argument("--latency", type=float, default=0.05, help="upstream latency, s")
    parser.add_argument("--chunk-delay", type=float, default=0.01, help="between chunks, s")
    parser.add_argument("--warmup", type=float, default=1.0, help="load before the first, s")
    parser.add_argument("--pause", type=float, default=0.2, help="after each handover, s")
    parser.add_argument(
        "--request-timeout", type=float, default=60.0, help="client timeout per request, s"
    )
    parser.add_argument(
        "--exit-timeout", type=float, default=30.0, help="bound on the old processes' exit, s"
    )
    parser.add_argument("--keep-log", action="store_true", help="keep the daemons' log")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args()
    # SIGTERM stops the bench as Ctrl-C does: through the finally that kills its daemons.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    work = Path(tempfile.mkdtemp(prefix="iop-edge-handover-"))
    started = time.perf_counter()
    try:
        r = asyncio.run(run(args, work))
    except KeyboardInterrupt:
        print(f"interrupted; the daemons' log is kept: {work / 'edge.log'}", file=sys.stderr)
        return 130
    elapsed = time.perf_counter() - started
    capacity = args.capacity
    p50_s = r["round_trip_ms"]["p50"] / 1000
    checks = {
        "failures": r["failures"] == 0,
        "refused": r["refused_connections"] == 0,
        "streams": r["streams_completed"] == r["streams_started"],
        "handovers": r["handovers_ok"] == r["handovers"] == args.handovers,
        "in_flight": all(m <= capacity for m in r["max_in_flight"]),
        "p50": p50_s < MAX_P50_S,
        "old_left": r["old_processes_left_running"] == 0,
        "last_stopped": r["last_stopped_by_sigterm"],
    }

    def mark(name: str) -> str:
        return "yes" if checks[name] else "**NO**"

    print(
        f"{args.handovers} handovers under {args.loops} chat + {args.stream_loops} streaming "
        f"client loops; 2 upstreams of capacity {capacity}, latency {args.latency * 1000:.0f} "
        f"ms, chunks {args.chunk_delay * 1000:.0f} ms apart; {r['requests_per_s']} req/s"
    )
    print()
    print("| measure | value | target | met |")
    print("| --- | ---: | ---: | :---: |")
    print(f"| requests (answered 200) | {r['requests']} ({r['requests_ok']}) | | |")
    kinds = ", ".join(f"{kind} {count}" for kind, count in r["failures_by_kind"].items())
    if kinds:
        kinds = f" ({kinds}; {r['failures_during_handovers']} overlapping a handover)"
    print(f"| failures{kinds} | {r['failures']} | 0 | {mark('failures')} |")
    print(f"| refused connections | {r['refused_connections']} | 0 | {mark('refused')} |")
    print(
        f"| streams completed / started | {r['streams_completed']} / {r['streams_started']} "
        f"| all | {mark('streams')} |"
    )
    print(
        f"| handovers ok / total | {r['handovers_ok']} / {r['handovers']} | all "
        f"| {mark('handovers')} |"
    )
    in_flight = ", ".join(f"{m} / {capacity}" for m in r["max_in_flight"])
    print(
        f"| max in-flight / capacity, per upstream | {in_flight} | ≤ capacity "
        f"| {mark('in_flight')} |"
    )
    for label, key, check in (
        ("handover round trip (POST /admin/restart) ms", "round_trip_ms", "p50"),
        ("handover `handed_over` duration_ms (old's log)", "handed_over_duration_ms", ""),
    ):
        t = r[key]
        target, met = (f"p50 < {MAX_P50_S * 1000:.0f}", mark(check)) if check else ("", "")
        print(
            f"| {label}: p50 / p95 / max | {t['p50']:.0f} / {t['p95']:.0f} / {t['max']:.0f} "
            f"| {target} | {met} |"
        )
    print(
        f"| old processes after their handover: requests finished / relayed to the new one "
        f"/ cut, total (`handover_drained`) | {r['old_finished']} / {r['old_relayed']} "
        f"/ {r['old_cut']} | | |"
    )
    print(
        f"| slots a new process inherited, most (`handover_taken`) "
        f"| {r['inherited_leases_max']} / {2 * capacity} | | |"
    )
    print(
        f"| old processes left running | {r['old_processes_left_running']} | 0 "
        f"| {mark('old_left')} |"
    )
    print(
        f"| last process stopped by SIGTERM | {'yes' if r['last_stopped_by_sigterm'] else 'no'} "
        f"| yes | {mark('last_stopped')} |"
    )
    passed = all(checks.values())
    for title, key in (
        ("Failures", "failure_examples"),
        ("Handovers not ok", "handover_problems"),
        ("Admin request errors", "admin_errors"),
    ):
        if r[key]:
            print(f"\n{title} (at most 20; t = seconds since the load started):")
            for line in r[key]:
                print(f"- {line}")
    if passed and not args.keep_log:
        shutil.rmtree(work, ignore_errors=True)
        r["log"] = None
    else:
        print(f"\nThe daemons' log is kept: {r['log']}")
    report = {
        "benchmark": "handover",
        "handovers_asked": args.handovers,
        "loops": args.loops,
        "stream_loops": args.stream_loops,
        "capacity": capacity,
        "latency_s": args.latency,
        "chunk_delay_s": args.chunk_delay,
        **r,
        "checks": checks,
        "elapsed_s": round(elapsed, 1),
        "passed": passed,
    }
    print()
    print(json.dumps(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
