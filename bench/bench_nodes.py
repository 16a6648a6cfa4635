"""Benchmark (issue 29): a request through a remote node on loopback against the same provider
local, side by side in one run on the same fake upstream.

One ``iop-edge serve`` (the proxy benchmark's config: auth on, metrics on, the JSON request log
at info) with two model groups on the same fake upstream (``iop_edge.testing.fake_openai``, 16
content chunks per answer unless asked for more, in its own process): ``bench-model``, an
``openai_compat`` provider of a local node (the **local** path), and ``bench-remote``, the same
provider on a remote node served by a real ``iop-node`` subprocess that dialled the edge's node
listener on loopback (the **remote** path: edge → link → node → fake). The load is
``bench/loadgen.py`` (chat completions, the Python engine, closed loop); each cell is measured
on both paths back to back, which goes first alternating by round:

==================  =============================================================
cell                what it gives
==================  =============================================================
``plain c=1``       added p50, non-streaming (target ≤ 1 ms); CPU per request
``stream c=1``      added p50, streaming, 16 chunks (target ≤ 1 ms); CPU per request
``plain c=16``      CPU per request, non-streaming
``stream c=16``     CPU per request, streaming, 16 chunks
``long stream       events per second through one link, 500-chunk streams (the
c=16``              ``[[fake:chunks=500]]`` directive): remote / local ≥ 0.8; CPU
==================  =============================================================

The figures (``bench/nodes_figures.py``) are medians over the rounds of per-round values: the
remote p50 minus the local p50; the remote events/s over the local events/s (streams that ended
in the window, per second, times the events of one stream, counted once per path before the
rounds); the CPU time per request of the edge process and of the node process, each read from
the kernel's CPU clock of the process (``bench/peers.py``) over the cell.

**Placement** (``taskset``, two cores). The gateway — the edge, and on the remote path the node
— gets core 1; the fake upstream, the load generator and this driver core 0 (the other
benchmarks' split). Both paths so have one core for the gateway and one for the world around
it; the remote path's extra work (the node, the link's frames on both ends) is paid out of the
same core, which is the conservative reading for the remote path (a real node has a machine of
its own). Putting the node on core 0 instead (``--placement apart``) measures something else:
the node's work then slows the load generator and the fake, the world of both paths no longer
being the same. The run prints the placement, and how busy each core was in the long streams:
a gateway core below 100 % means the world, not the gateway, set the pace.

Other work on the machine is measured in each round and a busy round is measured again
(``bench/check.py``'s ``quiet_rounds``). Prints the tables and writes
``bench/results/nodes-<time>.json``; exit status 0 when every target is met, 1 when one is
missed, 2 when the run is broken (a process did not start, the node did not connect, a request
failed, a cell measured nothing, no round was quiet).

    .venv/bin/python bench/bench_nodes.py               # about 3 minutes on 2 cores
    .venv/bin/python bench/bench_nodes.py --quick       # one short round: the output's shape
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

sys.path.insert(0, str(Path(__file__).resolve().parent))

from check import BrokenRun, git_rev, measure_cell, quiet_rounds
from nodes_figures import CELLS, PATHS, CellSpec, Rounds, all_met, figures, markdown
from peers import (
    MODEL,
    REMOTE_MODEL,
    BenchProcess,
    ProcessSet,
    Target,
    edge_config,
    free_port,
    new_principal_token,
    run_main,
    start_edge,
    start_fake,
    start_node,
    with_remote_node,
)
from proxy_bench import RESULTS, Bench, meta
from proxy_bench import parse_options as proxy_bench_options

from iop_edge.tokens import new_node_token, token_hash

EXIT_MET: Final = 0
EXIT_MISSED: Final = 1
EXIT_BROKEN: Final = 2
MAX_OTHER_WORK_PCT: Final = 15.0
MODELS: Final = {"local": MODEL, "remote": REMOTE_MODEL}
NODE: Final = "iop-node"
PLACEMENTS: Final = {
    "shared": "the gateway (the edge, and the node) on core 1; the fake upstream, the load "
    "generator and the driver on core 0",
    "apart": "the edge on core 1; the node, the fake upstream, the load generator and the "
    "driver on core 0",
}


def loadgen_args(spec: CellSpec) -> list[str]:
    """What ``bench/loadgen.py`` is told beyond the mode and concurrency: a long stream asks
    the fake for its chunks (and lets them all through ``max_tokens``)."""
    if spec.chunks == 16:
        return []
    return ["--fake-behavior", f"chunks={spec.chunks}", "--max-tokens", str(spec.chunks)]


def count_events(edge: Target, model: str, spec: CellSpec) -> int:
    """The events of one streamed answer of ``spec`` on ``model`` (its SSE frames, ``[DONE]``
    included), from one request sent now."""
    prompt = f"[[fake:chunks={spec.chunks}]] count the events"
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": spec.chunks,
        "stream": True,
    }
    request = urllib.request.Request(
        f"{edge.base_url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {edge.token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        text: bytes = answer.read()
    if not text.endswith(b"data: [DONE]\n\n"):
        raise BrokenRun(f"a {spec.chunks}-chunk stream of {model} did not end: {text[-200:]!r}")
    return text.count(b"\n\n")


def _measure_round(
    bench: Bench,
    edge: Target,
    node: BenchProcess,
    events: dict[str, dict[int, int]],
    index: int,
    label: str,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Every cell once on each path (the local one first in even rounds): key → path → cell."""
    cells: dict[str, dict[str, dict[str, Any]]] = {}
    busy = bench.options.warmup + bench.options.duration
    for spec in CELLS:
        order = PATHS if index % 2 == 0 else PATHS[::-1]
        for path in order:
            cell = measure_cell(
                bench,
                edge,
                spec.stream,
                spec.concurrency,
                model=MODELS[path],
                label=f"{path} {spec.key}",
                loadgen_args=loadgen_args(spec),
                others={NODE: node},
            )
            node_cpu = cell["others_cpu_s"][NODE]
            cell.update(
                path=path,
                node_cpu_us_per_req=round(node_cpu / max(1, cell["total_completed"]) * 1e6, 1),
                node_core_pct=round(node_cpu / busy * 100, 1),
                events_per_request=events[path][spec.chunks] if spec.stream else None,
            )
            cells.setdefault(spec.key, {})[path] = cell
        local, remote = cells[spec.key]["local"], cells[spec.key]["remote"]
        print(
            f"  {label} {spec.key:<16} p50 {local['latency_ms']['p50']:.3f} / "
            f"{remote['latency_ms']['p50']:.3f} ms; edge {local['cpu_us_per_req']:.0f} / "
            f"{remote['cpu_us_per_req']:.0f} µs, node {remote['node_cpu_us_per_req']:.0f} µs; "
            f"{local['finished_rps']:.1f} / {remote['finished_rps']:.1f} req/s (local / remote)",
            flush=True,
        )
    return cells


def measure(options: argparse.Namespace) -> tuple[Rounds, dict[str, Any]]:
    """Start the fake, the edge and the node, run the rounds; the cells and the run's meta."""
    bench_options = proxy_bench_options(
        [
            "--duration",
            str(options.duration),
            "--warmup",
            str(options.warmup),
            "--targets",
            "iop-edge",
            "--no-scaling",
            "--engine",
            "python",
            *(["--no-pin"] if options.no_pin else []),
        ]
    )
    workdir = Path(tempfile.mkdtemp(prefix="iop-bench-nodes-"))
    started = time.monotonic()
    with ProcessSet() as processes:
        bench = Bench(bench_options, processes, workdir)
        bench.echo = False
        pinned = bench.proxy_cores is not None and bench.load_cores is not None
        node_cores = bench.proxy_cores if options.placement == "shared" else bench.load_cores
        if bench.load_cores is not None:
            os.sched_setaffinity(0, {int(bench.load_cores)})
        info = meta(bench)
        info["pinning"] = PLACEMENTS[options.placement] if pinned else info["pinning"]
        print(f"placement: {info['pinning']}; logs: {workdir}", flush=True)
        try:
            bench.fake = start_fake(processes, workdir, bench.load_cores)
            token, digest = new_principal_token()
            node_token = new_node_token()
            upstream = bench.fake.base_url
            config = with_remote_node(
                edge_config(upstream, port=free_port(), token_hash=digest),
                upstream,
                token_hash=token_hash(node_token),
            )
            edge = start_edge(processes, workdir, bench.proxy_cores, config, token)
            node = start_node(processes, workdir, node_cores, config, node_token)
            events = {
                path: {
                    spec.chunks: count_events(edge, MODELS[path], spec)
                    for spec in CELLS
                    if spec.stream
                }
                for path in PATHS
            }
        except (RuntimeError, TimeoutError, OSError) as exc:
            raise BrokenRun(f"a process did not start: {exc}") from exc
        if events["local"] != events["remote"]:
            raise BrokenRun(f"the paths stream different answers: events {events}")
        assert edge.process is not None
        assert bench.fake.process is not None
        running: dict[int, list[BenchProcess]] = {}
        if pinned:
            gateway, world = int(bench.proxy_cores or 0), int(bench.load_cores or 0)
            running = {gateway: [edge.process], world: [bench.fake.process]}
            running[gateway if options.placement == "shared" else world].append(node)
        done = quiet_rounds(
            options.rounds,
            lambda index, label: _measure_round(bench, edge, node, events, index, label),
            proxy_core=int(bench.proxy_cores) if pinned and bench.proxy_cores else None,
            load_core=int(bench.load_cores) if pinned and bench.load_cores else None,
            running=running,
            max_other_work=options.max_other_work,
        )
    rounds: Rounds = {spec.key: {path: [] for path in PATHS} for spec in CELLS}
    for cells in done.results:
        for key, paths in cells.items():
            for path, cell in paths.items():
                rounds[key][path].append(cell)
    info.update(
        command=" ".join(["bench/bench_nodes.py", *options.argv]),
        git_rev=git_rev(),
        placement=options.placement,
        upstream="iop_edge.testing.fake_openai --behavior chunks=16 ([[fake:chunks=500]] for "
        "the long streams)",
        load_generator="bench/loadgen.py --engine python (chat completions)",
        events_per_stream={str(chunks): count for chunks, count in events["local"].items()},
        rounds=len(done.results),
        rounds_asked=options.rounds,
        rounds_discarded_busy=len(done.discarded),
        elapsed_s=round(time.monotonic() - started, 1),
        other_work_pct_per_round=done.other_work,
        other_work_pct_discarded=done.discarded,
    )
    return rounds, info


# -- command line ----------------------------------------------------------------------------


def parse_options(argv: list[str]) -> argparse.Namespace:
    """The command line (argparse exits 2 on a bad option)."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None,
        epilog="Exit status: 0 every target met, 1 one missed, 2 broken run.",
    )
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    parser.add_argument(
        "--duration", type=float, default=1.5, help="measured seconds per cell (default 1.5)"
    )
    parser.add_argument(
        "--warmup", type=float, default=0.3, help="warm-up seconds per cell (default 0.3)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="one round of short cells, measured however busy the machine is: the output's "
        "shape (the test), not figures",
    )
    parser.add_argument(
        "--placement",
        choices=tuple(PLACEMENTS),
        default="shared",
        help="shared (default): the node on the edge's core; apart: on the load's core",
    )
    parser.add_argument(
        "--max-other-work",
        type=float,
        default=MAX_OTHER_WORK_PCT,
        metavar="PCT",
        help="a round during which other processes took more than PCT %% of one of its cores "
        f"is measured again (default {MAX_OTHER_WORK_PCT:.0f})",
    )
    parser.add_argument("--no-pin", action="store_true", help="do not use taskset")
    parser.add_argument("--output", type=Path, default=RESULTS, help="where the run's JSON goes")
    options = parser.parse_args(argv)
    options.argv = argv
    if options.quick:
        options.rounds, options.duration, options.warmup = 1, 0.3, 0.1
        options.max_other_work = 100.0
    if options.rounds < 1:
        parser.error(f"--rounds: {options.rounds} is not >= 1")
    if options.duration <= 0 or options.warmup < 0:
        parser.error("--duration must be > 0 and --warmup >= 0")
    return options


def main(argv: list[str] | None = None) -> int:
    """Measure, print the tables, write the JSON; the exit status."""
    options = parse_options(sys.argv[1:] if argv is None else argv)
    try:
        rounds, info = measure(options)
    except BrokenRun as exc:
        print(f"\nbench_nodes: broken run: {exc}", file=sys.stderr)
        return EXIT_BROKEN
    result = figures(rounds)
    text = markdown(result)
    print(f"\n{text}\n")
    print(f"placement: {info['pinning']}")
    if info["rounds_discarded_busy"]:
        print(f"{info['rounds_discarded_busy']} busy round(s) discarded and measured again")
    if info["rounds"] < info["rounds_asked"]:
        print(f"only {info['rounds']} of {info['rounds_asked']} rounds were measured quiet")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = options.output / f"nodes-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"meta": info, "figures": result, "cells": rounds, "headline_markdown": text}
    path.write_text(json.dumps(document, indent=2) + "\n")
    shown = path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
    print(f"took {info['elapsed_s']:.0f} s; written: {shown}")
    return EXIT_MET if all_met(result) else EXIT_MISSED


if __name__ == "__main__":
    run_main(main)
