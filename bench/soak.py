"""Long reliability runs of iop-edge (not part of ``make test``); prints Markdown, then JSON.

Four runs, each switchable:

- **memory** (``--requests N``, default 100,000): ``iop-edge serve`` and the fake OpenAI
  upstream as subprocesses; ``--concurrency`` raw aiohttp clients send N chat requests
  (30 % streaming), of which ``--fault-every``-th carries an injected upstream fault (a 500,
  or a reset mid-stream) whose documented answer is checked. The daemon's RSS is read from
  ``/proc`` after a warm-up (``--warmup`` requests) and at the end; the admin status gives the
  leak counters; the daemon's children are counted (none may be left).
- **storm** (``--storm-good`` live refreshes, ``--storm-bad`` rejected files): the reload
  storm of ``iop_edge.testing.reload_storm`` at full size, in process, under SDK load.
- **fuzz** (``--fuzz N`` Hypothesis candidates, ``--seed``): the config fuzzer of
  ``iop_edge.testing.config_fuzz`` at full size, in process, under SDK load.
- **flapping** (``--flap-cycles`` times down ``--flap-down`` s, then up ``--flap-up`` s; issue
  12): ``iop-edge serve`` as a subprocess with model ``chat`` on two fake OpenAI upstreams,
  ``steady`` and ``flappy``; ``flappy`` (a ``FlappingUpstream`` of
  ``iop_edge.testing.flapping``) is stopped and started again on the same port while
  ``--flap-concurrency`` raw aiohttp clients ask ``chat`` (30 % streaming). Health is tuned so
  recovery shows: ``failure_threshold`` 3, ``--flap-eject-ms`` 1000, ``--flap-probe-ms`` 250,
  two attempts. Reported: requests, failures seen by clients, failovers by reason, ejections,
  probes and recoveries (``/metrics``, the ``provider_ejected`` / ``provider_recovered`` log
  lines), how long after each stop the provider was ejected and how long after each restart it
  was healthy and serving again (its first answered request).

Usage::

    .venv/bin/python bench/soak.py                      # all four, default sizes
    .venv/bin/python bench/soak.py --requests 20000 --skip storm,fuzz
    .venv/bin/python bench/soak.py --skip memory,storm,fuzz --flap-cycles 4   # flapping, 40 s
    .venv/bin/python bench/soak.py --json bench/results/soak.json

Exit status 0 when every run passed its criteria (memory: no failure, no leak, RSS growth
under 10 %; storm and fuzz: no failed request, no leak, every judgement as expected;
flapping: no failure seen by a client, an ejection in every down phase, a recovery by probe in
every up phase and serving again within ``eject_ms + probe_interval_ms`` of each restart, the
steady provider never ejected, no panic, no leak).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import yaml

from iop_edge.runtime.logs import configure_logging
from iop_edge.testing.config_fuzz import fuzz_texts, run_config_fuzz
from iop_edge.testing.edge_process import (
    EdgeProcess,
    edge_at_rest,
    edge_metrics,
    edge_process,
    edge_status,
    log_events,
    status_leaks,
)
from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_ollama import FakeOllama
from iop_edge.testing.fake_openai import FakeOpenAI
from iop_edge.testing.flapping import FlappingUpstream, FlapState
from iop_edge.testing.leaks import children_of
from iop_edge.testing.reload_storm import (
    SteadyLoad,
    StormState,
    WatchedEdge,
    dump,
    run_reload_storm,
    storm_doc,
    storm_plan,
    watched_edge,
)

IOP_EDGE = str(Path(sys.executable).with_name("iop-edge"))


# --- memory ----------------------------------------------------------------------------------


def rss_kb(pid: int) -> int:
    """Resident set size of ``pid`` in KiB (``VmRSS``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def memory_config(upstream: str) -> dict[str, Any]:
    """One OpenAI-compatible provider (the fake) and ``echo`` on ``cat``; auth open on
    loopback, metrics and console on ephemeral ports, info-level JSON logs."""
    return {
        "openai": {"listen": "127.0.0.1:0"},
        "metrics": {"listen": "127.0.0.1:0"},
        "console": {"listen": "127.0.0.1:0"},
        "logging": {"level": "info", "format": "json"},
        "provider_pool": {"max_queue": 256, "queue_timeout_ms": 30000},
        "models": [
            {"id": "chat", "context_window_tokens": 8192, "providers": ["up"]},
            {"id": "echo", "context_window_tokens": 8192, "providers": ["cat"]},
        ],
        "nodes": [
            {
                "id": "local",
                "adapters": [
                    {"name": "oa", "type": "openai_compat", "base_url": upstream},
                    {"name": "shell", "type": "cli", "command": "cat"},
                ],
                "providers": [
                    {
                        "id": "up",
                        "type": "openai_compat",
                        "category": "api",
                        "adapter": "oa",
                        "models": ["fake-model"],
                        "capacity": 64,
                    },
                    {
                        "id": "cat",
                        "type": "cli",
                        "category": "cli",
                        "adapter": "shell",
                        "models": ["echo"],
                        "capacity": 4,
                    },
                ],
            }
        ],
    }


class MemoryLoad:
    """Closed-loop raw aiohttp load with checked answers and injected faults."""

    def __init__(self, url: str, fault_every: int, cli_every: int) -> None:
        self.url = url + "/chat/completions"
        self.fault_every = fault_every
        self.cli_every = cli_every
        self.next = 0
        self.sent = 0
        self.ok = 0
        self.faults_injected = 0
        self.faults_reported = 0
        self.failures: list[str] = []

    async def run(self, count: int, concurrency: int) -> None:
        """Send ``count`` requests with ``concurrency`` workers."""
        limit = self.next + count
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def worker() -> None:
                while self.next < limit:
                    n = self.next
                    self.next += 1
                    await self.one(session, n)

            await asyncio.gather(*(worker() for _ in range(concurrency)))

    async def run_until(self, stop: asyncio.Event, concurrency: int) -> None:
        """Send requests with ``concurrency`` workers until ``stop`` is set."""
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def worker() -> None:
                while not stop.is_set():
                    n = self.next
                    self.next += 1
                    await self.one(session, n)

            await asyncio.gather(*(worker() for _ in range(concurrency)))

    async def one(self, session: aiohttp.ClientSession, n: int) -> None:
        stream = n % 10 < 3
        fault = self.fault_every and n % self.fault_every == self.fault_every - 1
        model = "echo" if self.cli_every and n % self.cli_every == 0 else "chat"
        prompt = f"request {n} of the soak"
        if fault:
            model = "chat"
            behavior = (
                FakeBehavior(fault="reset", fault_after=2) if stream else FakeBehavior(status=500)
            )
            prompt = f"{behavior.directive()} {prompt}"
            self.faults_injected += 1
        body = {"model": model, "stream": stream, "messages": [{"role": "user", "content": prompt}]}
        self.sent += 1
        try:
            async with session.post(self.url, json=body) as response:
                raw = await response.read()
                status = response.status
        except aiohttp.ClientError as exc:
            self.failures.append(f"{n}: {type(exc).__name__}: {exc}")
            return
        text, error = _answer(raw, stream, status)
        if fault:
            expected = (200, "upstream_error") if stream else (500, None)
            if (status, error) == expected:
                self.faults_reported += 1
            else:
                self.failures.append(f"{n}: fault answered {status} {error}")
        elif status == 200 and error is None and text.strip() == f"request {n} of the soak":
            self.ok += 1
        else:
            self.failures.append(f"{n}: {status} {error} {text[:60]!r}")


def _answer(raw: bytes, stream: bool, status: int) -> tuple[str, str | None]:
    """The answer text and the error code (``None``: no error) of a response body."""
    if status != 200 or not stream:
        body = orjson.loads(raw)
        if "error" in body:
            return "", body["error"]["code"]
        return body["choices"][0]["message"]["content"], None
    events = [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: ")]
    if not events or events[-1] != b"[DONE]":
        last = orjson.loads(events[-1]) if events else {}
        return "", (last.get("error") or {}).get("code", "truncated")
    text = "".join(
        c["delta"].get("content") or ""
        for e in events[:-1]
        for c in orjson.loads(e).get("choices") or ()
    )
    return text, None


async def memory_run(args: argparse.Namespace) -> dict[str, Any]:
    """The 100,000-request memory soak against subprocesses."""
    work = Path(tempfile.mkdtemp(prefix="iop-edge-soak-"))
    fake = subprocess.Popen(
        [sys.executable, "-m", "iop_edge.testing.fake_openai", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert fake.stdout is not None
    upstream = fake.stdout.readline().strip()
    config = work / "edge.yaml"
    config.write_text(yaml.safe_dump(memory_config(upstream), sort_keys=False))
    log_path = work / "edge.log"
    with open(log_path, "w") as log:
        daemon = subprocess.Popen(
            # the server alone: its memory and children, not a thin parent's
            [IOP_EDGE, "serve", "--config", str(config), "--drain-timeout", "10", "--no-parent"],
            stderr=log,
        )
    try:
        urls = await _listening(log_path, daemon)
        load = MemoryLoad(urls["openai"] + "/v1", args.fault_every, args.cli_every)
        started = time.perf_counter()
        await load.run(args.warmup, args.concurrency)
        rss_warm = rss_kb(daemon.pid)
        samples = [rss_warm]
        remaining = args.requests - args.warmup
        step = max(remaining // 10, 1)
        while remaining > 0:
            await load.run(min(step, remaining), args.concurrency)
            remaining -= step
            samples.append(rss_kb(daemon.pid))
        elapsed = time.perf_counter() - started
        rss_end = rss_kb(daemon.pid)
        async with (
            aiohttp.ClientSession() as session,
            session.get(urls["console"] + "/admin/status") as response,
        ):
            status = await response.json()
        counters = status["counters"]
        in_flight = sum(p["in_flight"] for p in status["providers"])
        leaks = {
            "in_flight": in_flight,
            "queue_depth": status["queue"]["depth"],
            "unreleased": counters["admitted"] + counters["inherited"] - counters["released"],
            "double_releases": counters["double_releases"],
            "child_processes": len(children_of(daemon.pid)),
        }
    finally:
        daemon.terminate()
        fake.terminate()
        exit_code = daemon.wait(30)
        fake.wait(30)
        assert fake.stdout is not None
        fake.stdout.close()
    log_lines = sum(
        1 for line in log_path.read_text().splitlines() if json.loads(line)["event"] == "request"
    )
    growth = (rss_end - rss_warm) / rss_warm * 100
    result = {
        "requests_sent": load.sent,
        "requests_ok": load.ok,
        "faults_injected": load.faults_injected,
        "faults_reported_as_documented": load.faults_reported,
        "failures": len(load.failures),
        "failure_examples": load.failures[:5],
        "leaks": leaks,
        "admitted": counters["admitted"],
        "released": counters["released"],
        "rejected": sum(counters["rejected"].values()),
        "request_log_lines": log_lines,
        "rss_after_warmup_kb": rss_warm,
        "rss_end_kb": rss_end,
        "rss_growth_percent": round(growth, 2),
        "rss_samples_kb": samples,
        "elapsed_s": round(elapsed, 1),
        "requests_per_s": round(load.sent / elapsed),
        "daemon_exit_code": exit_code,
    }
    result["passed"] = (
        not load.failures
        and not any(leaks.values())
        and growth < 10
        and load.faults_reported == load.faults_injected
        and exit_code == 0
    )
    return result


async def _listening(log_path: Path, daemon: subprocess.Popen[bytes]) -> dict[str, str]:
    """The listener URLs from the daemon's ``listening`` log line."""
    async with asyncio.timeout(30):
        while True:
            if daemon.poll() is not None:
                raise RuntimeError(f"iop-edge exited: {log_path.read_text()[-2000:]}")
            for line in log_path.read_text().splitlines():
                event = json.loads(line)
                if event.get("event") == "listening":
                    return {k: v for k, v in event.items() if isinstance(v, str)}
            await asyncio.sleep(0.05)


# --- storm and fuzz (in process, through iop_edge.testing) -----------------------------------


@contextlib.asynccontextmanager
async def fakes(latency: float) -> AsyncIterator[tuple[FakeOpenAI, FakeOllama]]:
    """The two HTTP fakes, each answering after ``latency`` seconds."""
    behavior = FakeBehavior(latency=latency)
    async with FakeOpenAI(behavior=behavior) as oa, FakeOllama(behavior=behavior) as ol:
        yield oa, ol


@contextlib.asynccontextmanager
async def loaded_edge(
    text: str, models: list[str], workers: int
) -> AsyncIterator[tuple[WatchedEdge, SteadyLoad]]:
    """A watched daemon on ``text`` in a temp directory, with a steady SDK load flowing."""
    with tempfile.TemporaryDirectory() as tmp:
        async with (
            watched_edge(Path(tmp), {}, text=text) as edge,
            openai.AsyncOpenAI(
                base_url=edge.daemon.openai_url, api_key="x", max_retries=0
            ) as client,
        ):
            load = SteadyLoad(client, models, workers)
            load.start()
            await load.progress(workers)
            yield edge, load


async def storm_run(args: argparse.Namespace) -> dict[str, Any]:
    """The reload storm at full size."""
    workers = 8
    async with fakes(0.002) as (oa, ol):
        steps = storm_plan(
            oa.base_url,
            ol.base_url,
            good=args.storm_good + 1,  # the first good file is the one the daemon starts on
            bad=args.storm_bad,
            workers=workers,
            seed=args.seed,
        )
        async with loaded_edge(steps[0].text, ["chat", "chat", "echo"], workers) as (edge, load):
            started = time.perf_counter()
            report = await run_reload_storm(edge, steps[1:], load)
            elapsed = time.perf_counter() - started
    result = {
        "refreshes_applied": report.refreshes_applied,
        "files_rejected": report.files_rejected,
        "requests_sent": report.requests_ok + len(report.request_failures),
        "failures": len(report.request_failures),
        "failure_examples": report.request_failures[:5],
        "misjudged": report.misjudged,
        "errors_without_path": report.unnamed_errors,
        "leaks": report.leaks,
        "final_state_equals_last_good_file": report.final_policy_matches
        and report.final_hash_matches
        and report.admin_status_matches,
        "elapsed_s": round(elapsed, 1),
    }
    result["passed"] = (
        report.refreshes_applied == args.storm_good
        and report.files_rejected == args.storm_bad
        and not report.request_failures
        and not report.misjudged
        and not report.unnamed_errors
        and not report.leaks
        and result["final_state_equals_last_good_file"]
    )
    return result


async def fuzz_run(args: argparse.Namespace) -> dict[str, Any]:
    """The config fuzzer at full size (fresh random examples, seeded)."""
    base_state = StormState((2, 2, 2), (0, 1, 2), (True, True, True), 16, 30000)
    async with fakes(0.001) as (oa, ol):
        base = storm_doc(oa.base_url, ol.base_url, base_state)
        texts = fuzz_texts(base, args.fuzz, derandomize=False, seed=args.seed)
        async with loaded_edge(dump(base), ["chat", "echo"], 4) as (edge, load):
            started = time.perf_counter()
            report = await run_config_fuzz(edge, texts, load, restore=dump(base))
            elapsed = time.perf_counter() - started
    result = {
        "candidates": report.candidates,
        "rejected": report.rejected,
        "accepted_then_reverted": report.applied + report.restart_required,
        "errors_without_path": report.unnamed_errors[:10],
        "running_config_changed_by_a_rejection": report.running_changed_on_rejection,
        "requests_sent": report.requests_ok + len(report.request_failures),
        "failures": len(report.request_failures),
        "failure_examples": report.request_failures[:5],
        "leaks": report.leaks,
        "still_serving": report.still_serving,
        "elapsed_s": round(elapsed, 1),
    }
    result["passed"] = (
        not report.unnamed_errors
        and report.running_changed_on_rejection == 0
        and not report.request_failures
        and not report.leaks
        and report.still_serving
    )
    return result


# --- flapping provider (issue 12) ------------------------------------------------------------

FLAP_THRESHOLD = 3
"""``failure_threshold`` of the flapping run (the default)."""


def flapping_config(steady: str, flappy: str, args: argparse.Namespace) -> dict[str, Any]:
    """Model ``chat`` on two OpenAI-compatible providers, ``steady`` and ``flappy`` (the fakes
    at those base URLs, each with the default health check ``GET /models``); two attempts per
    request, health tuned by ``--flap-eject-ms`` and ``--flap-probe-ms``."""

    def provider(pid: str) -> dict[str, Any]:
        return {
            "id": pid,
            "type": "openai_compat",
            "category": "api",
            "adapter": pid,
            "models": ["fake-model"],
            "capacity": 64,
        }

    return {
        "openai": {"listen": "127.0.0.1:0"},
        "metrics": {"listen": "127.0.0.1:0"},
        "console": {"listen": "127.0.0.1:0"},
        "logging": {"level": "info", "format": "json"},
        "provider_pool": {
            "max_queue": 256,
            "queue_timeout_ms": 30000,
            "failover": {"max_attempts": 2},
            "health": {
                "failure_threshold": FLAP_THRESHOLD,
                "eject_ms": args.flap_eject_ms,
                "max_eject_ms": max(300_000, args.flap_eject_ms),
                "probe_interval_ms": args.flap_probe_ms,
            },
        },
        "models": [
            {"id": "chat", "context_window_tokens": 8192, "providers": ["steady", "flappy"]}
        ],
        "nodes": [
            {
                "id": "local",
                "adapters": [
                    {"name": "steady", "type": "openai_compat", "base_url": steady},
                    {"name": "flappy", "type": "openai_compat", "base_url": flappy},
                ],
                "providers": [provider("steady"), provider("flappy")],
            }
        ],
    }


class HealthTimeline:
    """What ``/admin/status`` says of one provider, polled every ``interval`` seconds: each
    change of its health or ejection count, with the loop time it was seen at."""

    def __init__(self, edge: EdgeProcess, provider: str, interval: float = 0.01) -> None:
        self.edge = edge
        self.provider = provider
        self.interval = interval
        self.changes: list[tuple[float, str, int]] = []

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until ``stop`` is set."""
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            status = await edge_status(self.edge)
            p = next(p for p in status["providers"] if p["id"] == self.provider)
            seen = (p["health"], p["ejections"])
            if not self.changes or self.changes[-1][1:] != seen:
                self.changes.append((loop.time(), *seen))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)

    def ejected_after(self, began: float, until: float) -> float | None:
        """Seconds from ``began`` to the first ejection seen before ``until`` (``None``: none)."""
        before = max((c[2] for c in self.changes if c[0] <= began), default=0)
        return next(
            (round(t - began, 3) for t, _, n in self.changes if began < t < until and n > before),
            None,
        )

    def ejections_between(self, began: float, until: float) -> int:
        """Ejections (renewals included) counted from ``began`` to ``until``."""
        counts = [n for t, _, n in self.changes if t <= until]
        before = [n for t, _, n in self.changes if t <= began]
        return (counts[-1] if counts else 0) - (before[-1] if before else 0)

    def healthy_after(self, began: float, until: float) -> float | None:
        """Seconds from ``began`` to the provider seen healthy before ``until``."""
        return next(
            (
                round(t - began, 3)
                for t, h, _ in self.changes
                if began < t < until and h == "healthy"
            ),
            None,
        )


async def flapping_run(args: argparse.Namespace) -> dict[str, Any]:
    """A provider down ``--flap-down`` s, up ``--flap-up`` s, ``--flap-cycles`` times, while
    another one of its model group stays healthy, under steady load.

    Each fake waits ``--flap-latency`` before answering, so a stop cuts requests in flight on
    ``flappy`` before their first byte (they fail over); it then writes a whole answer (a
    stream too) in one go, so a stop never lands between a stream's first byte and its end,
    where by design (SPEC §5.1) no failover is possible. ``healthy_after_restart_s`` is seen
    by polling ``/admin/status`` every 10 ms; ``serving_after_restart_s`` is exact: when the
    restarted fake finished its first answer.
    """
    loop = asyncio.get_running_loop()
    behavior = FakeBehavior(latency=args.flap_latency)
    phases: list[tuple[FlapState, float, FakeOpenAI]] = []
    first_answers: list[asyncio.Task[float]] = []

    async def first_answer(fake: FakeOpenAI, began: float) -> float:
        await fake.wait_until(lambda: fake.completed > 0)
        return round(loop.time() - began, 3)

    def on_change(state: FlapState, cycle: int, fake: FakeOpenAI) -> None:
        began = loop.time()
        phases.append((state, began, fake))
        if state == "up":
            first_answers.append(asyncio.create_task(first_answer(fake, began)))

    async with (
        FakeOpenAI(behavior=behavior) as steady,
        FlappingUpstream(behavior) as flappy,
    ):
        work = Path(tempfile.mkdtemp(prefix="iop-edge-flap-"))
        config = work / "edge.yaml"
        config.write_text(
            yaml.safe_dump(flapping_config(steady.base_url, flappy.base_url, args), sort_keys=False)
        )
        with edge_process(config) as edge:
            load = MemoryLoad(edge.addresses["openai"] + "/v1", fault_every=0, cli_every=0)
            timeline = HealthTimeline(edge, "flappy")
            stop = asyncio.Event()
            first = flappy.fake
            assert first is not None
            tasks = [
                asyncio.create_task(load.run_until(stop, args.flap_concurrency)),
                asyncio.create_task(timeline.run(stop)),
            ]
            # Both providers serve before the first stop, so each stop hits a healthy provider.
            async with asyncio.timeout(30):
                await first.wait_until(lambda: first.completed > 0)
                await steady.wait_until(lambda: steady.completed > 0)
            started = loop.time()
            await flappy.flap(args.flap_down, args.flap_up, args.flap_cycles, on_change)
            ended = loop.time()
            stop.set()
            await asyncio.gather(*tasks)
            for task in first_answers:
                task.cancel()  # an up phase that never answered (its fake is stopped)
            await asyncio.gather(*first_answers, return_exceptions=True)
            metrics = await edge_metrics(edge)
            status = await edge_at_rest(edge)
        exit_code = edge.process.returncode  # edge_process checked it is 0
    flappy_served = first.completed + sum(f.completed for s, _, f in phases if s == "up")
    ends = [t for _, t, _ in phases[1:]] + [ended]
    ejected_after: list[float | None] = []
    renewals: list[int] = []
    healthy_after: list[float | None] = []
    for (state, began, _), until in zip(phases, ends, strict=True):
        if state == "down":
            ejected_after.append(timeline.ejected_after(began, until))
            renewals.append(timeline.ejections_between(began, until))
        else:
            healthy_after.append(timeline.healthy_after(began, until))
    serving_after = [None if task.cancelled() else task.result() for task in first_answers]
    ejected = [e for e in log_events(edge, "provider_ejected") if e["provider"] == "flappy"]
    recovered = [e for e in log_events(edge, "provider_recovered") if e["provider"] == "flappy"]
    # "probe" in each up phase; "request" when an attempt granted before an ejection answered
    # after it, which ends the ejection (the provider is ejected again by its next failures)
    recovered_via: dict[str, int] = {}
    for line in recovered:
        recovered_via[line["via"]] = recovered_via.get(line["via"], 0) + 1
    failovers: dict[str, int] = {}
    for key, value in metrics.items():
        if key.startswith("iop_edge_failovers_total{") and value:
            reason = key.split('reason="', 1)[1].split('"', 1)[0]
            failovers[reason] = failovers.get(reason, 0) + int(value)

    def sample(name: str, provider: str, extra: str = "") -> int:
        return int(metrics.get(f'{name}{{node="local",provider="{provider}"{extra}}}', 0))

    bound = (args.flap_eject_ms + args.flap_probe_ms) / 1000
    known = [s for s in serving_after if s is not None]
    result = {
        "cycles": args.flap_cycles,
        "down_s": args.flap_down,
        "up_s": args.flap_up,
        "concurrency": args.flap_concurrency,
        "health": f"threshold {FLAP_THRESHOLD}, eject {args.flap_eject_ms} ms, "
        f"probe every {args.flap_probe_ms} ms, 2 attempts",
        "requests_sent": load.sent,
        "requests_ok": load.ok,
        "failures": len(load.failures),
        "failure_examples": load.failures[:5],
        "answered_by_steady": steady.completed,
        "answered_by_flappy": flappy_served,
        "failovers_by_reason": failovers,
        "ejections_flappy": sample("iop_edge_provider_ejections_total", "flappy"),
        "ejections_steady": sample("iop_edge_provider_ejections_total", "steady"),
        "ejections_per_down_phase": renewals,
        "ejection_log_lines": len(ejected),
        "recoveries": len(recovered),
        "recoveries_via": recovered_via,
        "probes_ok": sample("iop_edge_health_probes_total", "flappy", ',result="ok"'),
        "probes_failed": sample("iop_edge_health_probes_total", "flappy", ',result="failed"'),
        "panics": len(log_events(edge, "model_panic")),
        "ejected_after_stop_s": ejected_after,
        "healthy_after_restart_s": healthy_after,
        "serving_after_restart_s": serving_after,
        "max_serving_after_restart_s": max(known) if known else None,
        "serving_bound_s": bound,
        "leaks": status_leaks(status),
        "elapsed_s": round(ended - started, 1),
        "daemon_exit_code": exit_code,
    }
    result["passed"] = (
        not load.failures
        and None not in ejected_after
        and len(known) == len(serving_after)
        and max(known, default=0) <= bound
        and None not in healthy_after
        and recovered_via.get("probe", 0) >= args.flap_cycles
        and sample("iop_edge_provider_ejections_total", "steady") == 0
        and not result["panics"]
        and not result["leaks"]
        and exit_code == 0
    )
    return result


# --- output ----------------------------------------------------------------------------------


def markdown(results: dict[str, Any]) -> str:
    """The results as Markdown tables (one per run)."""
    out = ["## iop-edge soak", ""]
    for name, values in results.items():
        if not isinstance(values, dict):
            continue
        out += [f"### {name}", "", "| figure | value |", "| --- | ---: |"]
        for key, value in values.items():
            if isinstance(value, list) and key != "failure_examples":
                value = ", ".join(str(v) for v in value)
            out.append(f"| {key} | {value} |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Run the soaks; print Markdown then JSON; exit 0 when all passed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--warmup", type=int, default=5_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--fault-every", type=int, default=100, help="0: no faults")
    parser.add_argument("--cli-every", type=int, default=200, help="every Nth to cat; 0: none")
    parser.add_argument("--storm-good", type=int, default=100)
    parser.add_argument("--storm-bad", type=int, default=20)
    parser.add_argument("--fuzz", type=int, default=200)
    parser.add_argument("--seed", type=int, default=random.SystemRandom().randrange(2**31))
    parser.add_argument("--flap-cycles", type=int, default=6, help="down/up cycles; 0: none")
    parser.add_argument("--flap-down", type=float, default=5.0, help="seconds down per cycle")
    parser.add_argument("--flap-up", type=float, default=5.0, help="seconds up per cycle")
    parser.add_argument("--flap-concurrency", type=int, default=8)
    parser.add_argument("--flap-eject-ms", type=int, default=1000)
    parser.add_argument("--flap-probe-ms", type=int, default=250)
    parser.add_argument("--flap-latency", type=float, default=0.002, help="upstream latency, s")
    parser.add_argument("--skip", default="", help="comma-separated: memory,storm,fuzz,flapping")
    parser.add_argument("--json", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    configure_logging("warning", "json", open(os.devnull, "w"))  # noqa: SIM115 - for the run

    async def run() -> dict[str, Any]:
        results: dict[str, Any] = {"seed": args.seed}
        if "storm" not in skip:
            results["storm"] = await storm_run(args)
        if "fuzz" not in skip:
            results["fuzz"] = await fuzz_run(args)
        if "memory" not in skip:
            results["memory"] = await memory_run(args)
        if "flapping" not in skip and args.flap_cycles:
            results["flapping"] = await flapping_run(args)
        return results

    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        results = asyncio.run(run())
    else:
        results = uvloop.run(run())
    print(markdown(results))
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    passed = all(v["passed"] for v in results.values() if isinstance(v, dict))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
