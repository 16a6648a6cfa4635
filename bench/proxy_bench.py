"""Proxy benchmark: iop-edge against the upstream directly, a bare aiohttp pass-through, LiteLLM.

One run starts a fast fake OpenAI upstream (``iop_edge.testing.fake_openai``, 16 content
chunks per stream) and sends the same closed-loop load (``bench/loadgen.py``: non-streaming and
streaming chat, concurrency 1, 16 and 64, a fixed duration per cell after a warm-up) to each
target in turn, one target at a time:

- ``direct``: the fake upstream itself;
- ``iop-edge``: ``iop-edge serve`` on a generated one-provider config (auth on with a generated
  principal token, metrics on, provider capacity 1024, ``max_queue`` 100,000, the shipped
  default ``logging.level: info`` in JSON to a log file) — the headline numbers;
- ``iop-edge-warn``: the same at ``logging.level: warning`` (no per-request log line), to show
  what logging costs; not used in the ratios;
- ``passthrough``: ``bench/passthrough.py``, the ceiling of this stack;
- ``litellm``: LiteLLM proxy from ``bench/.venv-litellm`` (``make bench-peers``), one worker,
  no database, master key on; skipped with the reason when missing or failing.

With ``taskset`` and two or more cores, the target runs on core 1 and the fake upstream, the
load generator and this driver on core 0. For each cell the target's CPU time is sampled from
``/proc`` (``cpu_us_per_req``: target CPU per completed request; ``core_pct``: its share of
one core), and the RSS of its process tree is read after its last cell.

A scaling run (``--scaling``, on by default) then measures iop-edge with 1, 100 and 1,000
providers in the model group (all on the fake upstream), and with 10,000 requests pending in
its queue: a second model group with one provider of capacity 1 whose single slot is held by a
request the fake parks (``hold``), 10,000 more requests waiting behind it (``max_queue``
10,000, verified full by a probe that gets 429 ``queue_full`` before and after the cells),
while the load runs on the main group.

Results: Markdown tables on stdout and ``bench/results/proxy-<timestamp>.json``. The report
starts with the headline (:func:`headline`): per mode and concurrency, iop-edge's CPU per request
against the pass-through's, their ratio and the added p50 — CPU per request of two targets in
the same run is steadier on a shared machine than req/s. ``bench/check.py`` (``make
bench-check``) holds the line on those figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers import (
    BENCH,
    MODEL,
    BenchProcess,
    CpuMeasured,
    ProcessSet,
    Target,
    edge_config,
    free_port,
    have_taskset,
    litellm_version,
    new_principal_token,
    run_json,
    sample_cpu,
    start_edge,
    start_fake,
    start_litellm,
    start_passthrough,
)

RESULTS = BENCH / "results"
LOADGEN = BENCH / "loadgen.py"
ALL_TARGETS = ("direct", "iop-edge", "iop-edge-warn", "passthrough", "litellm")

TARGETS_GOALS = {
    "ceiling_ratio_min": 0.70,
    "litellm_ratio_min": 20.0,
    "added_p50_c1_ms_max": 0.6,
    "rss_mib_max": 80.0,
    # issue 16: iop-edge's CPU per request over the pass-through's, same run (the headline)
    "cpu_ratio_plain_max": 1.2,
    "cpu_ratio_stream_max": 1.3,
}


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _num(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


class Bench:
    """One benchmark run: options, the processes, and the cells measured so far."""

    def __init__(self, options: argparse.Namespace, processes: ProcessSet, workdir: Path) -> None:
        self.options = options
        self.processes = processes
        self.workdir = workdir
        pin = have_taskset() and not options.no_pin
        self.proxy_cores = "1" if pin else None
        self.load_cores = "0" if pin else None
        self.cells: list[dict[str, Any]] = []
        self.skipped: dict[str, str] = {}
        self.rss_kib: dict[str, int] = {}
        self.startup_s: dict[str, float] = {}
        self.scaling: list[dict[str, Any]] = []
        self.fake: Target | None = None
        self.echo = True
        """Print one line per measured cell (``bench/check.py`` prints its own progress)."""

    # -- one cell ----------------------------------------------------------------------------

    def measure(
        self,
        target: Target,
        *,
        stream: bool,
        concurrency: int,
        model: str = MODEL,
        duration: float | None = None,
        api: str = "chat",
        store: bool = False,
        loadgen_args: Sequence[str] = (),
        others: Mapping[str, CpuMeasured] | None = None,
    ) -> dict[str, Any]:
        """Run the load generator once against ``target`` and return the cell (``api``: what
        ``bench/loadgen.py --api`` sends, chat completions, Anthropic Messages or OpenAI
        Responses; ``store``: its ``--store``, Responses' ``store: true``; ``loadgen_args``:
        more of its options). The CPU time of ``others`` (processes behind the target, by
        name) over the same window is in the cell's ``others_cpu_s``."""
        duration = duration if duration is not None else self.options.duration
        warmup = self.options.warmup
        argv = [
            sys.executable,
            str(LOADGEN),
            "--base-url",
            target.base_url,
            "--model",
            model,
            "-c",
            str(concurrency),
            "--duration",
            str(duration),
            "--warmup",
            str(warmup),
            "--engine",
            self.options.engine,
            "--api",
            api,
        ]
        if stream:
            argv.append("--stream")
        if store:
            argv.append("--store")
        argv += loadgen_args
        if target.token:
            argv += ["--token", target.token]
        behind = {name: sample_cpu(process) for name, process in (others or {}).items()}
        proxy_cpu = sample_cpu(target.process if target.name != "direct" else None)
        assert self.fake is not None
        fake_cpu = sample_cpu(self.fake.process)
        started = time.monotonic()
        result = run_json(argv, self.load_cores, timeout=warmup + duration + 120)
        wall = time.monotonic() - started
        cpu = proxy_cpu()
        others_cpu = {name: round(sample(), 4) for name, sample in behind.items()}
        total = max(1, result["total_completed"])
        busy = warmup + duration
        cell = {
            "target": target.name,
            "stream": stream,
            "concurrency": concurrency,
            **result,
            "target_cpu_s": round(cpu, 3),
            "others_cpu_s": others_cpu,
            "cpu_us_per_req": round(cpu / total * 1e6, 1) if target.name != "direct" else None,
            "core_pct": round(cpu / busy * 100, 1) if target.name != "direct" else None,
            "upstream_core_pct": round(fake_cpu() / busy * 100, 1),
            "client_core_pct": round(result["client_cpu_s"] / busy * 100, 1),
            "wall_s": round(wall, 2),
        }
        if not self.echo:
            return cell
        errors = f" errors={cell['errors']}" if cell["errors_total"] else ""
        print(
            f"  {target.name:<14} {'stream' if stream else 'plain ':<6} c={concurrency:<3} "
            f"{cell['rps']:>9,.1f} req/s  p50 {_ms(cell['latency_ms']['p50'])} ms  "
            f"p99 {_ms(cell['latency_ms']['p99'])} ms  target core {cell['core_pct']}%  "
            f"upstream core {cell['upstream_core_pct']}%  client core "
            f"{cell['client_core_pct']}%{errors}",
            flush=True,
        )
        if cell["errors_total"] and cell["first_error"]:
            print(f"    first error: {cell['first_error'][:300]}", flush=True)
        return cell

    def matrix(self, target: Target) -> None:
        """Every scenario of the main table against one target."""
        for stream in self.options.modes:
            for concurrency in self.options.concurrency:
                self.cells.append(self.measure(target, stream=stream, concurrency=concurrency))

    # -- targets -----------------------------------------------------------------------------

    def start_target(self, name: str) -> Target | str:
        """Start one target (or return why it is skipped)."""
        assert self.fake is not None
        upstream = self.fake.base_url
        if name == "direct":
            return self.fake
        started = time.monotonic()
        target: Target | str
        if name in ("iop-edge", "iop-edge-warn"):
            token, digest = new_principal_token()
            config = edge_config(
                upstream,
                port=free_port(),
                token_hash=digest,
                log_level="warning" if name == "iop-edge-warn" else "info",
            )
            target = start_edge(self.processes, self.workdir, self.proxy_cores, config, token, name)
        elif name == "passthrough":
            target = start_passthrough(self.processes, self.workdir, self.proxy_cores, upstream)
        elif name == "litellm":
            target = start_litellm(self.processes, self.workdir, self.proxy_cores, upstream)
        else:
            raise ValueError(name)
        if isinstance(target, Target):
            self.startup_s[name] = round(time.monotonic() - started, 2)
        return target

    def run_targets(self) -> None:
        """Measure each target in turn; stop it and keep its RSS after its last cell."""
        for name in self.options.targets:
            print(f"\n### target: {name}", flush=True)
            target = self.start_target(name)
            if isinstance(target, str):
                print(f"  skipped: {target}", flush=True)
                self.skipped[name] = target
                continue
            self.matrix(target)
            if target.process is not None and name != "direct":
                self.rss_kib[name] = target.process.rss_kib()
                print(f"  RSS after the run: {self.rss_kib[name] / 1024:.1f} MiB", flush=True)
                self.processes.stop(target.process)

    # -- scaling -----------------------------------------------------------------------------

    def scaling_run(self) -> None:
        """iop-edge with 1/100/1,000 providers, then with 10,000 pending requests."""
        assert self.fake is not None
        scenarios = [(False, 1), (False, 64), (True, 64)]
        duration = self.options.scaling_duration
        for providers in self.options.providers:
            print(f"\n### scaling: iop-edge with {providers} providers in the group", flush=True)
            token, digest = new_principal_token()
            capacity = max(1, 1024 // providers)  # total slots stay 1024: nothing ever queues
            config = edge_config(
                self.fake.base_url,
                port=free_port(),
                token_hash=digest,
                providers=providers,
                capacity=max(capacity, 64),
            )
            started = time.monotonic()
            name = f"iop-edge-{providers}p"
            target = start_edge(self.processes, self.workdir, self.proxy_cores, config, token, name)
            startup = time.monotonic() - started
            for stream, concurrency in scenarios:
                cell = self.measure(
                    target, stream=stream, concurrency=concurrency, duration=duration
                )
                cell.update(providers=providers, pending=0, startup_s=round(startup, 2))
                self.scaling.append(cell)
            rss = target.process.rss_kib() if target.process else 0
            for cell in self.scaling[-len(scenarios) :]:
                cell["rss_kib"] = rss
            self.processes.stop(target.process) if target.process else None
        if self.options.pending:
            self.pending_run(scenarios, duration)

    def pending_run(self, scenarios: list[tuple[bool, int]], duration: float) -> None:
        """The same cells with 0, then ``--pending`` requests waiting in the edge's queue."""
        assert self.fake is not None
        pending = self.options.pending
        print(f"\n### scaling: iop-edge with {pending:,} pending requests", flush=True)
        token, digest = new_principal_token()
        config = edge_config(
            self.fake.base_url,
            port=free_port(),
            token_hash=digest,
            max_queue=pending,
            held_group=True,
        )
        # Every parked request is an open connection: room for them and the load's.
        config["openai"]["max_connections"] = pending + 4096
        target = start_edge(
            self.processes, self.workdir, self.proxy_cores, config, token, "iop-edge-pending"
        )
        assert target.process is not None
        for stream, concurrency in scenarios:
            cell = self.measure(target, stream=stream, concurrency=concurrency, duration=duration)
            cell.update(providers=1, pending=0, rss_kib=target.process.rss_kib())
            self.scaling.append(cell)
        parker = self.processes.start(
            BenchProcess(
                "parker",
                [
                    sys.executable,
                    str(LOADGEN),
                    "--base-url",
                    target.base_url,
                    "--model",
                    "bench-held",
                    "--token",
                    token,
                    "--park",
                    str(pending + 1),  # one holds the group's only slot, the rest wait
                ],
                self.workdir / "parker.log",
                cores=self.load_cores,
                stdout_pipe=True,
            )
        )
        print(f"  parker: {parker.read_line(timeout=120)}", flush=True)
        port = int(target.base_url.rsplit(":", 1)[1].split("/")[0])
        connected = wait_connections(port, pending + 1, timeout=120)
        print(f"  connections established to the edge: {connected:,}", flush=True)
        metrics_url = f"http://{config['metrics']['listen']}/metrics"
        before = self.probe_queue_full(target)
        depth_before = queue_depth(metrics_url)
        print(
            f"  queue full before the cells (a probe got 429 queue_full): {before}; "
            f"iop_edge_queue_depth: {depth_before}",
            flush=True,
        )
        rss_parked = target.process.rss_kib()
        cells = []
        for stream, concurrency in scenarios:
            cell = self.measure(target, stream=stream, concurrency=concurrency, duration=duration)
            cell.update(providers=1, pending=pending, rss_kib=rss_parked)
            cells.append(cell)
        after = self.probe_queue_full(target)
        depth_after = queue_depth(metrics_url)
        print(
            f"  queue still full after the cells: {after}; iop_edge_queue_depth: {depth_after}",
            flush=True,
        )
        for cell in cells:
            cell.update(
                queue_full_before=before,
                queue_full_after=after,
                queue_depth_before=depth_before,
                queue_depth_after=depth_after,
            )
        self.scaling.extend(cells)
        self.processes.stop(parker)
        self.processes.stop(target.process)

    def probe_queue_full(self, target: Target, timeout: float = 90.0) -> bool:
        """Whether one more request is refused with 429 ``queue_full`` (the queue is full).

        A probe that is queued instead times out after 1 s and goes away (``client_gone``), so
        it never adds to the pending count. Retries until ``timeout``.
        """
        body = json.dumps(
            {"model": "bench-held", "messages": [{"role": "user", "content": "probe"}]}
        ).encode()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            request = urllib.request.Request(
                target.base_url + "/chat/completions",
                data=body,
                headers={
                    "Content-Type": "application/json",
                    "Authorization": f"Bearer {target.token}",
                },
            )
            try:
                with urllib.request.urlopen(request, timeout=1.0):
                    return False
            except urllib.error.HTTPError as exc:
                return exc.code == 429 and b"queue_full" in exc.read()
            except OSError:
                time.sleep(0.5)  # queued (timed out): not full yet
        return False


def wait_connections(port: int, count: int, timeout: float) -> int:
    """Wait until ``count`` TCP connections to 127.0.0.1:``port`` are established (or
    ``timeout``); return how many there are. 10,000 simultaneous connects overflow the listen
    backlog, so the last ones arrive seconds after they were sent."""
    deadline = time.monotonic() + timeout
    found = 0
    while time.monotonic() < deadline:
        found = 0
        try:
            lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
        except OSError:
            return -1
        for line in lines:
            fields = line.split()
            if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found += 1
        if found >= count:
            return found
        time.sleep(0.5)
    return found


def queue_depth(metrics_url: str) -> float | None:
    """``iop_edge_queue_depth`` from the edge's Prometheus endpoint, when it serves one."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("iop_edge_queue_depth "):
            return float(line.split()[1])
    return None


# -- reporting -------------------------------------------------------------------------------


def _cell(cells: Iterable[dict[str, Any]], target: str, stream: bool, c: int) -> dict[str, Any]:
    for cell in cells:
        if cell["target"] == target and cell["stream"] == stream and cell["concurrency"] == c:
            return cell
    return {}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def summarize(bench: Bench) -> dict[str, Any]:
    """Added latency, ratios and target verdicts from the cells."""
    scenarios = []
    for stream in bench.options.modes:
        for c in bench.options.concurrency:
            direct = _cell(bench.cells, "direct", stream, c)
            rows = []
            for name in bench.options.targets:
                cell = _cell(bench.cells, name, stream, c)
                if not cell:
                    continue
                lat = cell["latency_ms"]
                base = direct.get("latency_ms", {})
                rows.append(
                    {
                        "target": name,
                        "rps": cell["rps"],
                        "p50_ms": lat["p50"],
                        "p99_ms": lat["p99"],
                        "added_p50_ms": round(lat["p50"] - base["p50"], 3)
                        if name != "direct" and base.get("p50") is not None and lat["p50"]
                        else None,
                        "added_p99_ms": round(lat["p99"] - base["p99"], 3)
                        if name != "direct" and base.get("p99") is not None and lat["p99"]
                        else None,
                        "ttfb_p50_ms": cell["ttfb_ms"]["p50"],
                        "errors": cell["errors_total"],
                        "cpu_us_per_req": cell["cpu_us_per_req"],
                        "core_pct": cell["core_pct"],
                        "upstream_core_pct": cell["upstream_core_pct"],
                        "client_core_pct": cell["client_core_pct"],
                    }
                )
            edge = _cell(bench.cells, "iop-edge", stream, c)
            ceiling = _cell(bench.cells, "passthrough", stream, c)
            litellm = _cell(bench.cells, "litellm", stream, c)
            scenarios.append(
                {
                    "stream": stream,
                    "concurrency": c,
                    "rows": rows,
                    "edge_over_ceiling": _ratio(edge.get("rps"), ceiling.get("rps")),
                    "edge_over_litellm": _ratio(edge.get("rps"), litellm.get("rps")),
                    "edge_cpu_over_ceiling_cpu": _ratio(
                        edge.get("cpu_us_per_req"), ceiling.get("cpu_us_per_req")
                    ),
                }
            )
    return {
        "headline": headline(scenarios),
        "scenarios": scenarios,
        "verdicts": verdicts(bench, scenarios),
    }


def headline(scenarios: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The headline figures: iop-edge's CPU per request against the pass-through's, per scenario.

    CPU time per request of two targets measured in the same run is steadier on a shared machine
    than req/s, which follows whatever else the cores are doing.
    """
    rows = []
    for scenario in scenarios:
        by_target = {row["target"]: row for row in scenario["rows"]}
        edge = by_target.get("iop-edge", {})
        ceiling = by_target.get("passthrough", {})
        rows.append(
            {
                "stream": scenario["stream"],
                "concurrency": scenario["concurrency"],
                "edge_cpu_us_per_req": edge.get("cpu_us_per_req"),
                "passthrough_cpu_us_per_req": ceiling.get("cpu_us_per_req"),
                "cpu_ratio": scenario["edge_cpu_over_ceiling_cpu"],
                "cpu_ratio_max": TARGETS_GOALS[
                    "cpu_ratio_stream_max" if scenario["stream"] else "cpu_ratio_plain_max"
                ],
                "added_p50_ms": edge.get("added_p50_ms"),
            }
        )
    return rows


def headline_markdown(rows: list[dict[str, Any]]) -> str:
    """The headline table (printed first by ``proxy_bench.py`` and again by ``make bench``)."""
    lines = [
        "#### Headline: iop-edge CPU per request against the bare pass-through (same run)\n",
        "| scenario | iop-edge CPU µs/req | pass-through CPU µs/req | ratio | target | "
        "added p50 ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        kind = "streaming" if row["stream"] else "non-streaming"
        lines.append(
            f"| {kind} c={row['concurrency']} | {_num(row['edge_cpu_us_per_req'])} | "
            f"{_num(row['passthrough_cpu_us_per_req'])} | {_ratio_text(row['cpu_ratio'], 'x')} "
            f"| ≤ {row['cpu_ratio_max']:.2f}x | {_ms(row['added_p50_ms'])} |"
        )
    return "\n".join(lines)


def verdicts(bench: Bench, scenarios: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target of the issues: met or not, with the measured values."""
    out: list[dict[str, Any]] = []

    def verdict(goal: str, values: dict[str, Any], met: bool | None) -> None:
        out.append({"goal": goal, "measured": values, "met": met})

    def label(s: dict[str, Any]) -> str:
        return f"{'stream' if s['stream'] else 'plain'} c={s['concurrency']}"

    for stream, kind in ((False, "non-streaming"), (True, "streaming")):
        limit = TARGETS_GOALS["cpu_ratio_stream_max" if stream else "cpu_ratio_plain_max"]
        ratios = {
            label(s): s["edge_cpu_over_ceiling_cpu"] for s in scenarios if s["stream"] == stream
        }
        known = [v for v in ratios.values() if v is not None]
        verdict(
            f"iop-edge CPU per request <= {limit}x the pass-through's, {kind} (issue 16)",
            ratios,
            all(v <= limit for v in known) if known else None,
        )
    ceiling = {label(s): s["edge_over_ceiling"] for s in scenarios}
    known = [v for v in ceiling.values() if v is not None]
    verdict(
        "iop-edge throughput >= 70% of the bare pass-through (every scenario)",
        ceiling,
        all(v >= TARGETS_GOALS["ceiling_ratio_min"] for v in known) if known else None,
    )
    versus = {label(s): s["edge_over_litellm"] for s in scenarios}
    known = [v for v in versus.values() if v is not None]
    verdict(
        "iop-edge throughput >= 20x LiteLLM's (every scenario)",
        versus,
        all(v >= TARGETS_GOALS["litellm_ratio_min"] for v in known) if known else None,
    )
    added: dict[str, Any] = {}
    for s in scenarios:
        if s["concurrency"] != 1:
            continue
        for row in s["rows"]:
            if row["target"] == "iop-edge":
                added[label(s)] = row["added_p50_ms"]
    known = [v for v in added.values() if v is not None]
    verdict(
        "iop-edge added p50 < 0.6 ms at concurrency 1 (issue 5 said < 1 ms)",
        added,
        all(v < TARGETS_GOALS["added_p50_c1_ms_max"] for v in known) if known else None,
    )
    rss = bench.rss_kib.get("iop-edge")
    verdict(
        "iop-edge RSS < 80 MB after the run",
        {"rss_mib": round(rss / 1024, 1) if rss else None},
        (rss / 1024 < TARGETS_GOALS["rss_mib_max"]) if rss else None,
    )
    return out


def markdown(bench: Bench, summary: dict[str, Any]) -> str:
    """The report as Markdown."""
    lines: list[str] = ["", headline_markdown(summary["headline"])]
    for scenario in summary["scenarios"]:
        kind = "streaming" if scenario["stream"] else "non-streaming"
        lines += [
            f"\n#### {kind}, concurrency {scenario['concurrency']}\n",
            "| target | req/s | p50 ms | p99 ms | added p50 ms | added p99 ms | errors "
            "| target CPU µs/req | target core % |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for row in scenario["rows"]:
            lines.append(
                f"| {row['target']} | {_num(row['rps'])} | {_ms(row['p50_ms'])} | "
                f"{_ms(row['p99_ms'])} | {_ms(row['added_p50_ms'])} | {_ms(row['added_p99_ms'])} "
                f"| {row['errors']} | {_num(row['cpu_us_per_req'])} | {_num(row['core_pct'])} |"
            )
        lines.append(
            f"\niop-edge / pass-through: {_ratio_text(scenario['edge_over_ceiling'])}; "
            f"iop-edge / LiteLLM: {_ratio_text(scenario['edge_over_litellm'], 'x')}; "
            f"iop-edge CPU per request / pass-through's: "
            f"{_ratio_text(scenario['edge_cpu_over_ceiling_cpu'], 'x')}"
        )
    lines += ["\n#### Memory (RSS of the process tree after its last cell)\n"]
    lines += ["| target | RSS MiB | start-up s |", "| --- | ---: | ---: |"]
    for name, kib in bench.rss_kib.items():
        lines.append(f"| {name} | {kib / 1024:.1f} | {bench.startup_s.get(name, 0):.2f} |")
    for name, reason in bench.skipped.items():
        lines.append(f"\nSkipped {name}: {reason}")
    if bench.scaling:
        lines += [
            "\n#### Scaling (iop-edge)\n",
            "| providers | pending | scenario | req/s | p50 ms | p99 ms | errors "
            "| CPU µs/req | RSS MiB |",
            "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for cell in bench.scaling:
            lines.append(
                f"| {cell['providers']:,} | {cell['pending']:,} | "
                f"{'stream' if cell['stream'] else 'plain'} c={cell['concurrency']} | "
                f"{_num(cell['rps'])} | {_ms(cell['latency_ms']['p50'])} | "
                f"{_ms(cell['latency_ms']['p99'])} | {cell['errors_total']} | "
                f"{_num(cell['cpu_us_per_req'])} | {cell.get('rss_kib', 0) / 1024:.1f} |"
            )
    lines += ["\n#### Targets\n", "| goal | measured | met |", "| --- | --- | --- |"]
    for item in summary["verdicts"]:
        met = {True: "yes", False: "**no**", None: "not measured"}[item["met"]]
        measured = ", ".join(f"{k}: {v}" for k, v in item["measured"].items())
        lines.append(f"| {item['goal']} | {measured} | {met} |")
    return "\n".join(lines)


def _ratio_text(value: float | None, suffix: str = "") -> str:
    if value is None:
        return "—"
    return f"{value:.2f}{suffix}" if suffix else f"{value:.0%}"


def meta(bench: Bench) -> dict[str, Any]:
    """Where and how the run was made."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    pinned = bench.proxy_cores is not None
    return {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "aiohttp": metadata.version("aiohttp"),
        "iop_edge": metadata.version("iop-edge"),
        "litellm": litellm_version(),
        "pinning": (
            f"taskset: target under test on core {bench.proxy_cores}; fake upstream, load "
            f"generator and driver on core {bench.load_cores}"
            if pinned
            else "none (taskset missing, one core, or --no-pin)"
        ),
        "load_generator": (
            "bench/loadgen.py --engine wrk (wrk, 1 thread, keep-alive, Lua body checks)"
            if bench.options.engine == "wrk"
            else "bench/loadgen.py (aiohttp + uvloop, closed loop, keep-alive)"
        ),
        "upstream": "iop_edge.testing.fake_openai --behavior chunks=16",
        "duration_s": bench.options.duration,
        "warmup_s": bench.options.warmup,
        "edge_log_level": "info (json, to a file) for iop-edge; warning for iop-edge-warn",
        "added_latency": "target percentile minus direct percentile, same scenario, same run",
    }


# -- command line ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The command line of the driver."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None,
        epilog="Default: ~6 minutes (5 s cells); --quick: ~3 minutes (2 s cells).",
    )
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds per cell")
    parser.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per cell")
    parser.add_argument("--quick", action="store_true", help="2 s cells, 0.5 s warm-up")
    parser.add_argument(
        "--targets",
        default=",".join(ALL_TARGETS),
        help=f"comma-separated subset of {','.join(ALL_TARGETS)} (direct is always run)",
    )
    parser.add_argument("--concurrency", default="1,16,64", help="comma-separated levels")
    parser.add_argument("--modes", default="plain,stream", help="plain, stream or both")
    parser.add_argument("--no-litellm", action="store_true", help="skip LiteLLM")
    parser.add_argument("--no-scaling", action="store_true", help="skip the scaling run")
    parser.add_argument("--scaling-only", action="store_true", help="only the scaling run")
    parser.add_argument("--providers", default="1,100,1000", help="scaling: provider counts")
    parser.add_argument("--pending", type=int, default=10_000, help="scaling: pending requests")
    parser.add_argument("--no-pin", action="store_true", help="do not use taskset")
    parser.add_argument(
        "--engine",
        choices=("auto", "wrk", "python"),
        default="auto",
        help="load generator engine (auto: wrk when installed, else the Python client)",
    )
    parser.add_argument("--output", type=Path, default=RESULTS, help="directory for the JSON")
    return parser


def parse_options(argv: list[str] | None) -> argparse.Namespace:
    """Parse and normalise the options."""
    parser = build_parser()
    options = parser.parse_args(argv)
    if options.quick:
        options.duration, options.warmup = 2.0, 0.5
    options.scaling_duration = min(options.duration, 3.0)
    options.concurrency = [int(c) for c in options.concurrency.split(",") if c]
    modes = {m.strip() for m in options.modes.split(",") if m.strip()}
    if not modes <= {"plain", "stream"}:
        parser.error("--modes takes plain and/or stream")
    options.modes = [m == "stream" for m in ("plain", "stream") if m in modes]
    targets = [t.strip() for t in options.targets.split(",") if t.strip()]
    unknown = set(targets) - set(ALL_TARGETS)
    if unknown:
        parser.error(f"--targets: unknown {', '.join(sorted(unknown))}")
    if options.no_litellm and "litellm" in targets:
        targets.remove("litellm")
    options.targets = ["direct", *[t for t in targets if t != "direct"]]
    if options.scaling_only:
        options.targets = ["direct"]
    options.providers = [int(p) for p in options.providers.split(",") if p]
    if options.engine == "auto":
        options.engine = "wrk" if shutil.which("wrk") else "python"
    return options


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the tables; write the JSON."""
    options = parse_options(argv)

    def terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # unwinds through ProcessSet, which stops every process

    signal.signal(signal.SIGTERM, terminate)
    workdir = Path(tempfile.mkdtemp(prefix="iop-proxy-bench-"))
    with ProcessSet() as processes:
        bench = Bench(options, processes, workdir)
        if bench.load_cores is not None:
            os.sched_setaffinity(0, {int(bench.load_cores)})
        info = meta(bench)
        print(f"pinning: {info['pinning']}", flush=True)
        print(f"logs and generated configs: {workdir}", flush=True)
        print(f"load generator: {info['load_generator']}", flush=True)
        bench.fake = start_fake(processes, workdir, bench.load_cores)
        print(f"fake upstream: {bench.fake.base_url}", flush=True)
        bench.run_targets()
        if not options.no_scaling:
            bench.scaling_run()
    summary = summarize(bench)
    report = markdown(bench, summary)
    print(report)
    options.output.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = options.output / f"proxy-{stamp}.json"
    path.write_text(
        json.dumps(
            {
                "meta": info,
                "goals": TARGETS_GOALS,
                "summary": summary,
                "rss_kib": bench.rss_kib,
                "startup_s": bench.startup_s,
                "skipped": bench.skipped,
                "cells": bench.cells,
                "scaling": bench.scaling,
                "headline_markdown": headline_markdown(summary["headline"]),
                "markdown": report,
            },
            indent=2,
        )
    )
    print(f"\nwritten: {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted; every process was stopped", file=sys.stderr)
        sys.exit(130)
