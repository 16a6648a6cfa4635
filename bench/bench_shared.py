"""Benchmark: several edges sharing one pool through a store (``provider_pool.shared``, a real
``redis-server`` on loopback) against an edge whose pool is its own, side by side in one run.

Four ``iop-edge serve`` (the proxy benchmark's config: auth on, metrics on, the JSON request log
at info) on the same fake upstream (``iop_edge.testing.fake_openai``, 16 content chunks per
answer, in its own process): ``solo``, without ``shared``; and ``r1``, ``r2``, ``r3``, the same
config with ``provider_pool.shared`` on one ``redis-server`` (``iop_edge.testing.redis_server``,
password on, saving nothing). Each has two model groups: ``bench-model`` (one provider of
capacity 1024: never the bound) and ``bench-capped`` (one provider of capacity ``--capacity``,
shared by ``r1``–``r3`` in the store). The load is ``bench/loadgen.py`` (chat completions, the
Python engine, closed loop). Each round measures, one after the other:

==========================  ===============================================================
cells                       what they give
==========================  ===============================================================
``plain c=1``,              on ``solo`` and on ``r1`` back to back: the added p50 of a
``stream c=1``              lease (target ≤ 1 ms); CPU per request
``plain c=16``,             on ``solo`` and on ``r1``: CPU per request (the edge's, the
``stream c=16``             store's, the other two replicas', which hear every release)
``one without``,            ``bench-capped`` with the fake answering after ``--delay-ms``,
``one with``,               ``3 × capacity`` client loops: on ``solo``; on ``r1``; spread
``three with``              evenly over ``r1``, ``r2``, ``r3`` (``loadgen --also-base-url``).
                            Three replicas' req/s over one's, without ``shared`` and with it
                            (target ≥ 0.95 each); the ideal is capacity / delay
==========================  ===============================================================

Which edge goes first alternates by round (the throughput setups rotate). The figures
(``bench/shared_figures.py``) are medians over the rounds of per-round values. CPU per request
is read from the kernel's CPU clock of each process (``bench/peers.py``) over the cell; the
store's scripts per request from its ``INFO commandstats`` (``EVALSHA`` calls).

**Placement** (``taskset``, two cores). Every edge gets core 1; the fake upstream, the load
generator and this driver core 0 (the other benchmarks' split). ``--placement shared``
(default) puts ``redis-server`` on core 1 too: the store's work is paid out of the edges' core,
the conservative reading (a real store has a machine of its own); ``--placement apart`` puts it
on core 0. The run prints the placement.

Other work on the machine is measured in each round and a busy round is measured again
(``bench/check.py``'s ``quiet_rounds``). Prints the tables and writes
``bench/results/shared-<time>.json``; exit status 0 when every target is met, 1 when one is
missed, 2 when the run is broken (a process did not start, the replicas did not join the store,
a request failed, a cell measured nothing, no round was quiet).

    .venv/bin/python bench/bench_shared.py               # about 3 minutes on 2 cores
    .venv/bin/python bench/bench_shared.py --quick       # one short round: the output's shape
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from check import BrokenRun, git_rev, measure_cell, quiet_rounds
from peers import (
    MODEL,
    CpuMeasured,
    ProcessSet,
    Target,
    edge_config,
    free_port,
    new_principal_token,
    process_cpu_seconds,
    run_main,
    start_edge,
    start_fake,
)
from proxy_bench import RESULTS, Bench, meta
from proxy_bench import parse_options as proxy_bench_options
from shared_figures import (
    CELLS,
    EDGES,
    REPLICAS,
    SETUPS,
    STORE,
    CellSpec,
    Rounds,
    Throughput,
    all_met,
    figures,
    markdown,
)

from iop_edge.shared.records import redact_store_url
from iop_edge.testing.redis_server import RedisServer, RedisServerNotFound

EXIT_MET: Final = 0
EXIT_MISSED: Final = 1
EXIT_BROKEN: Final = 2
MAX_OTHER_WORK_PCT: Final = 15.0
CAPPED_MODEL: Final = "bench-capped"
"""The model group of one provider of ``--capacity``, the one the replicas share."""
LEASE_TTL_MS: Final = 10_000
PLACEMENTS: Final = {
    "shared": "every edge and redis-server on core 1; the fake upstream, the load generator "
    "and the driver on core 0",
    "apart": "every edge on core 1; redis-server, the fake upstream, the load generator and "
    "the driver on core 0",
}


@dataclass(frozen=True)
class StoreProcess:
    """The ``redis-server`` a :class:`RedisServer` runs, as the benchmark measures it."""

    pid: int

    def cpu_seconds(self) -> float:
        """CPU seconds the server used so far (every thread)."""
        return process_cpu_seconds(self.pid)

    def pin(self, core: int) -> None:
        """Move every thread of the server to ``core``."""
        for task in os.listdir(f"/proc/{self.pid}/task"):
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(int(task), {core})


def capped_config(
    upstream: str, *, token_hash: str, edge_id: str, capacity: int, store: str | None
) -> dict[str, Any]:
    """An edge's config (:func:`peers.edge_config`, on a free port) with the model group
    :data:`CAPPED_MODEL` (one provider of ``capacity`` on the same upstream), and with
    ``provider_pool.shared`` on ``store`` unless it is ``None``."""
    config = edge_config(upstream, port=free_port(), token_hash=token_hash)
    config["edge"] = {"id": edge_id}
    node = config["nodes"][0]
    node["providers"] = [
        *node["providers"],
        {
            "id": "capped",
            "type": "openai_compat",
            "category": "local_inference",
            "adapter": "fake",
            "models": [MODEL],
            "capacity": capacity,
        },
    ]
    config["models"] = [
        *config["models"],
        {
            "id": CAPPED_MODEL,
            "context_window_tokens": 131072,
            "providers": [{"id": "capped", "target": MODEL}],
        },
    ]
    if store is not None:
        config["provider_pool"] = {
            **config["provider_pool"],
            "shared": {
                "store": store,
                "lease_ttl_ms": LEASE_TTL_MS,
                "on_store_down": "static_split",
            },
        }
    return config


def store_calls(client: redis.Redis) -> int:
    """The scripts the store has run so far (``EVALSHA`` calls: every lease operation)."""
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


class SharedBench:
    """The processes of one run and how a cell is measured on them."""

    def __init__(
        self,
        bench: Bench,
        edges: Mapping[str, Target],
        store: StoreProcess,
        client: redis.Redis,
        options: argparse.Namespace,
    ) -> None:
        self.bench = bench
        self.edges = edges
        self.store = store
        self.client = client
        self.options = options
        self.ideal_rps = options.capacity / (options.delay_ms / 1000)

    def _others(self, target: str) -> dict[str, CpuMeasured]:
        others: dict[str, CpuMeasured] = {
            name: edge.process
            for name, edge in self.edges.items()
            if name != target and edge.process is not None
        }
        others[STORE] = self.store
        return others

    def cell(
        self,
        target: str,
        spec: CellSpec,
        *,
        label: str,
        model: str = MODEL,
        loadgen_args: list[str] | None = None,
        duration: float | None = None,
    ) -> dict[str, Any]:
        """One cell on edge ``target`` (the load's first URL), with the CPU of every other
        edge and of the store, and the store's scripts per request."""
        before = store_calls(self.client)
        cell = measure_cell(
            self.bench,
            self.edges[target],
            spec.stream,
            spec.concurrency,
            model=model,
            label=label,
            loadgen_args=loadgen_args or [],
            others=self._others(target),
            duration=duration,
        )
        calls = store_calls(self.client) - before
        cell.update(
            edge=target,
            store_calls=calls,
            store_calls_per_req=round(max(0, calls) / max(1, cell["total_completed"]), 3),
        )
        return cell

    def measure_round(
        self, index: int, label: str
    ) -> tuple[dict[str, dict[str, dict[str, Any]]], dict[str, dict[str, Any]]]:
        """Every cell once: the per-request cells on each edge (``solo`` first in even
        rounds), then the throughput setups (rotated by round)."""
        per_request: dict[str, dict[str, dict[str, Any]]] = {}
        for spec in CELLS:
            order = EDGES if index % 2 == 0 else EDGES[::-1]
            pair = {}
            for edge in order:
                target = "solo" if edge == "without" else REPLICAS[0]
                pair[edge] = self.cell(target, spec, label=f"{edge} {spec.key}")
            per_request[spec.key] = pair
            without, with_ = pair["without"], pair["with"]
            print(
                f"  {label} {spec.key:<11} p50 {without['latency_ms']['p50']:.3f} / "
                f"{with_['latency_ms']['p50']:.3f} ms; edge {without['cpu_us_per_req']:.0f} / "
                f"{with_['cpu_us_per_req']:.0f} µs, store "
                f"{with_['others_cpu_s'][STORE] / max(1, with_['total_completed']) * 1e6:.0f} "
                f"µs, {with_['store_calls_per_req']:.2f} scripts/req (without / with)",
                flush=True,
            )
        throughput: dict[str, dict[str, Any]] = {}
        shift = index % len(SETUPS)
        for setup in (*SETUPS[shift:], *SETUPS[:shift]):
            throughput[setup] = self.throughput_cell(setup, label)
        print(
            f"  {label} capacity {self.options.capacity}: "
            + ", ".join(f"{s} {throughput[s]['finished_rps']:.1f}" for s in SETUPS)
            + f" req/s (ideal {self.ideal_rps:.0f})",
            flush=True,
        )
        return per_request, throughput

    def throughput_cell(self, setup: str, label: str) -> dict[str, Any]:
        """``3 × capacity`` client loops on :data:`CAPPED_MODEL`, the fake answering after the
        delay: on ``solo``, on ``r1``, or spread over ``r1``–``r3``."""
        args = ["--fake-behavior", f"latency={self.options.delay_ms / 1000:g}"]
        target = "solo" if setup == "one without" else REPLICAS[0]
        if setup == "three with":
            for name in REPLICAS[1:]:
                args += ["--also-base-url", self.edges[name].base_url]
        cell = self.cell(
            target,
            CellSpec(setup, False, 3 * self.options.capacity),
            label=f"{label} {setup}",
            model=CAPPED_MODEL,
            loadgen_args=args,
            duration=self.options.throughput_duration,
        )
        cell.update(setup=setup, of_ideal=round(cell["finished_rps"] / self.ideal_rps, 4))
        return cell


def _start_store(core: int | None) -> tuple[RedisServer, StoreProcess]:
    try:
        server = RedisServer(password=secrets.token_hex(16))
        server.start()
    except (RedisServerNotFound, RuntimeError, OSError) as exc:
        raise BrokenRun(f"redis-server did not start: {exc}") from exc
    assert server.process is not None
    store = StoreProcess(server.process.pid)
    if core is not None:
        store.pin(core)
    return server, store


def _version(binary: str) -> str:
    done = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    return done.stdout.strip()


def measure(options: argparse.Namespace) -> tuple[Rounds, Throughput, dict[str, Any]]:
    """Start the fake, the store and the edges, run the rounds; the cells and the run's meta."""
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
    workdir = Path(tempfile.mkdtemp(prefix="iop-bench-shared-"))
    started = time.monotonic()
    with ProcessSet() as processes, contextlib.ExitStack() as stack:
        bench = Bench(bench_options, processes, workdir)
        bench.echo = False
        pinned = bench.proxy_cores is not None and bench.load_cores is not None
        gateway = int(bench.proxy_cores) if bench.proxy_cores is not None else None
        world = int(bench.load_cores) if bench.load_cores is not None else None
        store_core = gateway if options.placement == "shared" else world
        if world is not None:
            os.sched_setaffinity(0, {world})
        info = meta(bench)
        info["pinning"] = PLACEMENTS[options.placement] if pinned else info["pinning"]
        print(f"placement: {info['pinning']}; logs: {workdir}", flush=True)
        server, store = _start_store(store_core)
        stack.callback(server.close)
        client = stack.enter_context(
            redis.Redis(host="127.0.0.1", port=server.port, password=server.password)
        )
        try:
            bench.fake = start_fake(processes, workdir, bench.load_cores)
            token, digest = new_principal_token()
            upstream = bench.fake.base_url
            edges: dict[str, Target] = {}
            for name in ("solo", *REPLICAS):
                config = capped_config(
                    upstream,
                    token_hash=digest,
                    edge_id=f"edge-bench-{name}",
                    capacity=options.capacity,
                    store=None if name == "solo" else server.url,
                )
                edges[name] = start_edge(
                    processes, workdir, bench.proxy_cores, config, token, name=name
                )
        except (RuntimeError, TimeoutError, OSError) as exc:
            raise BrokenRun(f"a process did not start: {exc}") from exc
        members = int(client.zcard("iop-edge:members"))
        if members != len(REPLICAS):
            raise BrokenRun(
                f"{members} edge(s) joined the store, not {len(REPLICAS)}: see the logs in "
                f"{workdir}"
            )
        run = SharedBench(bench, edges, store, client, options)
        running: dict[int, list[CpuMeasured]] = {}
        if gateway is not None and world is not None:
            running = {gateway: [], world: []}
            for edge in edges.values():
                assert edge.process is not None
                running[gateway].append(edge.process)
            assert bench.fake.process is not None
            running[world].append(bench.fake.process)
            if store_core is not None:
                running[store_core].append(store)
        done = quiet_rounds(
            options.rounds,
            run.measure_round,
            proxy_core=gateway,
            load_core=world,
            running=running,
            max_other_work=options.max_other_work,
        )
        redis_version = _version(server.binary)
        store_url = redact_store_url(server.url)
    rounds: Rounds = {spec.key: {edge: [] for edge in EDGES} for spec in CELLS}
    throughput: Throughput = {setup: [] for setup in SETUPS}
    for per_request, setups in done.results:
        for key, pair in per_request.items():
            for which, cell in pair.items():
                rounds[key][which].append(cell)
        for setup, cell in setups.items():
            throughput[setup].append(cell)
    info.update(
        command=" ".join(["bench/bench_shared.py", *options.argv]),
        git_rev=git_rev(),
        placement=options.placement,
        store=f"{redis_version} on loopback ({store_url}), lease_ttl_ms {LEASE_TTL_MS}",
        upstream="iop_edge.testing.fake_openai --behavior chunks=16 ([[fake:latency=S]] for "
        "the throughput cells)",
        load_generator="bench/loadgen.py --engine python (chat completions; --also-base-url "
        "for three replicas)",
        capacity=options.capacity,
        delay_ms=options.delay_ms,
        throughput_duration_s=options.throughput_duration,
        rounds=len(done.results),
        rounds_asked=options.rounds,
        rounds_discarded_busy=len(done.discarded),
        elapsed_s=round(time.monotonic() - started, 1),
        other_work_pct_per_round=done.other_work,
        other_work_pct_discarded=done.discarded,
    )
    return rounds, throughput, info


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
        "--throughput-duration",
        type=float,
        default=2.0,
        help="measured seconds per throughput cell (default 2)",
    )
    parser.add_argument(
        "--capacity",
        type=int,
        default=8,
        help="the shared provider's capacity (default 8); the load is 3 × capacity loops",
    )
    parser.add_argument(
        "--delay-ms",
        type=float,
        default=20.0,
        help="the fake's delay before each answer in the throughput cells (default 20)",
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
        help="shared (default): redis-server on the edges' core; apart: on the load's core",
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
        options.throughput_duration = 0.5
        options.max_other_work = 100.0
    if options.rounds < 1:
        parser.error(f"--rounds: {options.rounds} is not >= 1")
    if options.duration <= 0 or options.warmup < 0 or options.throughput_duration <= 0:
        parser.error("--duration and --throughput-duration must be > 0, --warmup >= 0")
    if options.capacity < 1:
        parser.error(f"--capacity: {options.capacity} is not >= 1")
    if options.delay_ms <= 0:
        parser.error(f"--delay-ms: {options.delay_ms} is not > 0")
    return options


def main(argv: list[str] | None = None) -> int:
    """Measure, print the tables, write the JSON; the exit status."""
    options = parse_options(sys.argv[1:] if argv is None else argv)
    try:
        rounds, throughput, info = measure(options)
    except BrokenRun as exc:
        print(f"\nbench_shared: broken run: {exc}", file=sys.stderr)
        return EXIT_BROKEN
    result = figures(rounds, throughput, options.capacity / (options.delay_ms / 1000))
    text = markdown(result, capacity=options.capacity, delay_ms=options.delay_ms)
    print(f"\n{text}\n")
    print(f"placement: {info['pinning']}")
    if info["rounds_discarded_busy"]:
        print(f"{info['rounds_discarded_busy']} busy round(s) discarded and measured again")
    if info["rounds"] < info["rounds_asked"]:
        print(f"only {info['rounds']} of {info['rounds_asked']} rounds were measured quiet")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = options.output / f"shared-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "meta": info,
        "figures": result,
        "cells": rounds,
        "throughput": throughput,
        "headline_markdown": text,
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
    shown = path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
    print(f"took {info['elapsed_s']:.0f} s; written: {shown}")
    return EXIT_MET if all_met(result) else EXIT_MISSED


if __name__ == "__main__":
    run_main(main)
