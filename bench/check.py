"""``make bench-check``: a short proxy benchmark judged against ``bench/baseline.json``.

Measures, with the machinery of ``bench/proxy_bench.py`` (same fake upstream, same load
generator, same CPU sampling, same pinning: targets on core 1, the rest on core 0),
three targets — the fake upstream ``direct``, ``iop-edge`` and the bare ``passthrough`` — in
both modes (non-streaming, streaming) at concurrency 1, 16 and 64, in short cells, in several
rounds. Within a round each scenario measures iop-edge and the pass-through back to back (and
at concurrency 1 the upstream directly too), the order reversed every other round, so the two
runs of a pair see the same machine state. Per scenario the figures are the median over the
rounds of the pair's CPU-per-request ratio (iop-edge / pass-through) and, at concurrency 1, of
the added p50 (iop-edge p50 - direct p50). ``bench/regression.py`` judges them.

Exit status: 0 every figure within the tolerance (or better); 1 a figure is worse than the
baseline by more than the tolerance; 2 the run is broken (a target did not start, a request
failed, a cell measured nothing, the baseline is missing or unreadable or covers other cells,
or was measured with another load generator or pinning, or other work took more than
``--max-other-work`` % of a core during the run) — never 0 on a broken run.

    .venv/bin/python bench/check.py            # make bench-check: about 100 s on 2 cores
    .venv/bin/python bench/check.py --update   # make bench-baseline: 18 rounds, about 3.5 min
    .venv/bin/python bench/check.py --compare bench/results/check-<stamp>.json   # a saved run

Not named ``bench_*.py``: ``make bench`` (``bench/run_all.py``) does not run it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, Generic, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers import MODEL, ROOT, CpuMeasured, ProcessSet, Target, have_taskset, run_main, start_fake
from proxy_bench import RESULTS, Bench, meta
from proxy_bench import parse_options as proxy_bench_options
from regression import (
    EXIT_BROKEN,
    EXIT_PASS,
    FORMAT,
    Figures,
    FiguresError,
    busy_problem,
    cell_from_rounds,
    compare,
    exit_code,
    parse_figures,
    percent,
    render,
)

BASELINE = ROOT / "bench" / "baseline.json"
TARGETS = ("direct", "iop-edge", "passthrough")
MODES = (False, True)
CONCURRENCY = (1, 16, 64)
ADDED_P50_AT = 1
"""The concurrency whose added p50 is judged (higher ones queue in the client and the proxy)."""
BUDGET_S = 120.0
CHECK_ROUNDS = 9
UPDATE_ROUNDS = 2 * CHECK_ROUNDS
"""The baseline is measured rarely and judged against every run: twice the rounds (about 3.5
minutes) make it a steadier centre, so a check run's own noise is most of what it meets."""
MAX_OTHER_WORK_PCT = 15.0
R = TypeVar("R")


class BrokenRun(Exception):
    """The measurement cannot be trusted: a target did not start, a request failed, ..."""


# -- measuring -------------------------------------------------------------------------------


def _busy_jiffies(cpus: set[int]) -> dict[int, int]:
    """Non-idle jiffies (USER_HZ) so far of each CPU in ``cpus``, from ``/proc/stat``."""
    busy: dict[int, int] = {}
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return busy
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        index = int(name[3:])
        if index in cpus:
            fields = [int(v) for v in rest.split()]
            # user nice system idle iowait irq softirq steal: busy = all but idle and iowait
            busy[index] = sum(fields[:8]) - fields[3] - fields[4]
    return busy


def busy_now(cores: set[int], seconds: float) -> dict[int, float]:
    """Each core's busy share (in %) over the next ``seconds``, while this process sleeps."""
    before = _busy_jiffies(cores)
    time.sleep(seconds)
    after = _busy_jiffies(cores)
    tick = os.sysconf("SC_CLK_TCK")
    return {core: round((after[core] - before[core]) / tick / seconds * 100, 1) for core in after}


class ForeignLoad:
    """How much CPU other work used on the benchmark's cores while it ran.

    Busy time of each core from ``/proc/stat`` minus this run's own processes there: the
    targets on the proxy core; this driver, the fake upstream and the load generators (all
    reaped children by the end) on the load core.
    """

    def __init__(self, proxy_core: int | None, load_core: int | None) -> None:
        self.cores = {c for c in (proxy_core, load_core) if c is not None}
        self.proxy_core, self.load_core = proxy_core, load_core
        self.started = time.monotonic()
        self.busy = _busy_jiffies(self.cores)
        self.own = self._own_cpu()
        self.targets_cpu = 0.0

    @staticmethod
    def _own_cpu() -> float:
        import resource

        total = 0.0
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
            usage = resource.getrusage(who)
            total += usage.ru_utime + usage.ru_stime
        return total

    def percent(self, running: Mapping[int, float] | None = None) -> dict[str, float]:
        """Other work per core, in % of that core over the run (call after every process ended,
        or name in ``running`` the CPU seconds that this run's processes still running used
        on each core since this object was made)."""
        if self.proxy_core is None or self.load_core is None:
            return {}
        wall = time.monotonic() - self.started
        tick = os.sysconf("SC_CLK_TCK")
        busy = _busy_jiffies(self.cores)
        if not busy or wall <= 0:
            return {}
        used = {core: (busy[core] - self.busy.get(core, 0)) / tick for core in busy}
        own_total = self._own_cpu() - self.own
        running = running or {}
        foreign = {
            f"core {self.proxy_core} (targets)": used[self.proxy_core]
            - self.targets_cpu
            - running.get(self.proxy_core, 0.0),
            f"core {self.load_core} (upstream, load)": used[self.load_core]
            - (own_total - self.targets_cpu)
            - running.get(self.load_core, 0.0),
        }
        return {name: round(max(0.0, value) / wall * 100, 1) for name, value in foreign.items()}


@dataclass
class QuietRounds(Generic[R]):
    """What :func:`quiet_rounds` measured: the rounds kept, and other work's share of each
    core (in %) in each round kept and each thrown away."""

    results: list[R]
    other_work: list[dict[str, float]]
    discarded: list[dict[str, float]]


def quiet_rounds(
    count: int,
    measure_round: Callable[[int, str], R],
    *,
    proxy_core: int | None,
    load_core: int | None,
    running: Mapping[int, Sequence[CpuMeasured]],
    max_other_work: float,
) -> QuietRounds[R]:
    """Measure ``count`` rounds, each by ``measure_round(index, label)`` (``index`` counts
    every round measured so far, thrown away or not; ``label`` says "round 2/7").

    A round during which other work took more than ``max_other_work`` % of one of the run's
    cores (:class:`ForeignLoad`; ``running``: this run's processes still running, by the core
    they are pinned to) is thrown away and measured again, up to ``count`` more times in all:
    on this shared machine a neighbour's test run moves a CPU per request by a third, and the
    figures would say more about the neighbour than about the edge. :class:`BrokenRun` when
    no round was quiet.
    """
    done = QuietRounds[R]([], [], [])
    for attempt in range(2 * count):
        if len(done.results) == count:
            break
        label = f"round {len(done.results) + 1}/{count}"
        foreign = ForeignLoad(proxy_core, load_core)
        before = {core: [p.cpu_seconds() for p in group] for core, group in running.items()}
        result = measure_round(attempt, label)
        used = {
            core: sum(p.cpu_seconds() for p in group) - sum(before[core])
            for core, group in running.items()
        }
        other = foreign.percent(used)
        if any(pct > max_other_work for pct in other.values()):
            done.discarded.append(other)
            shares = ", ".join(f"{core} {pct:.0f} %" for core, pct in other.items())
            print(f"  {label}: other work took {shares}: measured again", flush=True)
            continue
        done.results.append(result)
        done.other_work.append(other)
    if not done.results:
        raise BrokenRun(
            f"other work took more than {max_other_work:.0f} % of a core in each of "
            f"{len(done.discarded)} rounds; run it again when the machine is quiet"
        )
    return done


def measure_cell(
    bench: Bench,
    target: Target,
    stream: bool,
    concurrency: int,
    *,
    api: str = "chat",
    model: str = MODEL,
    store: bool = False,
    label: str | None = None,
    loadgen_args: Sequence[str] = (),
    others: Mapping[str, CpuMeasured] | None = None,
    duration: float | None = None,
) -> dict[str, Any]:
    """One cell, checked (:class:`BrokenRun` when a request failed or no CPU was measured);
    measured once more when the machine stalled through its window. ``label`` names the cell
    in errors (default: the target, mode and concurrency); ``api``, ``model``, ``store``,
    ``loadgen_args``, ``others`` and ``duration`` are :meth:`Bench.measure`'s."""
    label = label or f"{target.name} {'stream' if stream else 'plain'} c={concurrency}"
    for attempt in (1, 2):
        try:
            cell = bench.measure(
                target,
                stream=stream,
                concurrency=concurrency,
                api=api,
                model=model,
                store=store,
                loadgen_args=loadgen_args,
                others=others,
                duration=duration,
            )
        except (RuntimeError, OSError, ValueError) as exc:
            raise BrokenRun(f"{label}: the load generator failed: {exc}") from exc
        except subprocess.TimeoutExpired as exc:
            raise BrokenRun(f"{label}: the load generator hung: {exc}") from exc
        if cell["errors_total"]:
            raise BrokenRun(
                f"{label}: {cell['errors_total']} failed request(s) {cell['errors']}; first: "
                f"{(cell['first_error'] or '')[:300]}"
            )
        if cell["target"] != "direct" and cell["total_completed"] and not cell["cpu_us_per_req"]:
            raise BrokenRun(f"{label}: no CPU time was measured for the target")
        if cell["requests"] and cell["latency_ms"]["p50"] is not None:
            return cell
        # Requests completed, none inside the window: every one of them outlasted it. Seen when
        # the whole machine stalls for a second; a second stall in a row is not noise.
        stalled = (
            f"{label}: no request completed inside the "
            f"{duration or bench.options.duration} s window "
            f"({cell['total_completed']} completed in all, {cell['wall_s']} s)"
        )
        if attempt == 2:
            raise BrokenRun(f"{stalled}, twice in a row")
        print(f"  {stalled}; measuring it again", flush=True)
    raise AssertionError("unreachable")


def measure(options: argparse.Namespace) -> dict[str, Any]:
    """Run the rounds and return a figures document (raises :class:`BrokenRun`)."""
    argv = [
        "--duration",
        str(options.duration),
        "--warmup",
        str(options.warmup),
        "--targets",
        ",".join(TARGETS),
        "--no-scaling",
        "--engine",
        "python",
    ]
    bench_options = proxy_bench_options([*argv, *(["--no-pin"] if options.no_pin else [])])
    if have_taskset() and not options.no_pin and options.max_other_work < 100:
        # Refuse at once, rather than after a minute and a half spent disturbing the neighbours.
        busy = {c: p for c, p in busy_now({0, 1}, 2.0).items() if p > options.max_other_work}
        if busy:
            shares = ", ".join(f"core {core} {pct:.0f} %" for core, pct in busy.items())
            raise BrokenRun(
                f"the machine is busy: other work takes {shares} (more than "
                f"{options.max_other_work:.0f} %); run it again when the machine is quiet"
            )
    workdir = Path(tempfile.mkdtemp(prefix="iop-bench-check-"))
    samples: dict[tuple[bool, int, str], list[dict[str, Any]]] = {}
    started = time.monotonic()
    with ProcessSet() as processes:
        bench = Bench(bench_options, processes, workdir)
        bench.echo = False
        if bench.load_cores is not None:
            os.sched_setaffinity(0, {int(bench.load_cores)})
        foreign = ForeignLoad(
            int(bench.proxy_cores) if bench.proxy_cores else None,
            int(bench.load_cores) if bench.load_cores else None,
        )
        info = meta(bench)
        print(f"pinning: {info['pinning']}; logs: {workdir}", flush=True)
        try:
            bench.fake = start_fake(processes, workdir, bench.load_cores)
            targets: dict[str, Target] = {}
            for name in TARGETS:
                target = bench.start_target(name)
                if isinstance(target, str):
                    raise BrokenRun(f"{name} did not start: {target}")
                targets[name] = target
        except (RuntimeError, TimeoutError, OSError) as exc:
            raise BrokenRun(f"a target did not start: {exc}") from exc
        for round_index in range(options.rounds):
            for stream in MODES:
                for concurrency in CONCURRENCY:
                    names = list(TARGETS if concurrency == ADDED_P50_AT else TARGETS[1:])
                    if round_index % 2:
                        names.reverse()
                    measured = {}
                    for name in names:
                        cell = measure_cell(bench, targets[name], stream, concurrency)
                        samples.setdefault((stream, concurrency, name), []).append(cell)
                        measured[name] = cell
                    print(_progress(round_index, options.rounds, stream, concurrency, measured))
        for name in ("iop-edge", "passthrough"):
            process = targets[name].process
            foreign.targets_cpu += process.cpu_seconds() if process else 0.0
    elapsed = time.monotonic() - started
    cells = [
        _cell_figures(samples, stream, concurrency)
        for stream in MODES
        for concurrency in CONCURRENCY
    ]
    return {
        "format": FORMAT,
        "meta": _meta(options, info, elapsed, foreign.percent()),
        "cells": cells,
    }


def _cell_figures(
    samples: dict[tuple[bool, int, str], list[dict[str, Any]]], stream: bool, concurrency: int
) -> dict[str, Any]:
    def cpu(name: str) -> list[float]:
        return [float(cell["cpu_us_per_req"]) for cell in samples[(stream, concurrency, name)]]

    def p50(name: str) -> list[float]:
        return [float(cell["latency_ms"]["p50"]) for cell in samples[(stream, concurrency, name)]]

    at_c1 = concurrency == ADDED_P50_AT
    cell = cell_from_rounds(
        "stream" if stream else "plain",
        concurrency,
        cpu("iop-edge"),
        cpu("passthrough"),
        p50("iop-edge") if at_c1 else None,
        p50("direct") if at_c1 else None,
    )
    # Kept for the record (not judged): each target's p50 in each round.
    for name in TARGETS:
        if (stream, concurrency, name) in samples:
            cell["rounds"][f"{name}_p50_ms"] = p50(name)
    return cell


def _progress(
    round_index: int, rounds: int, stream: bool, concurrency: int, cells: dict[str, Any]
) -> str:
    edge, ceiling = cells["iop-edge"], cells["passthrough"]
    text = (
        f"  round {round_index + 1}/{rounds}  {'stream' if stream else 'plain '} "
        f"c={concurrency:<3} iop-edge {edge['cpu_us_per_req']:6.1f} µs/req  pass-through "
        f"{ceiling['cpu_us_per_req']:6.1f} µs/req  ratio "
        f"{edge['cpu_us_per_req'] / ceiling['cpu_us_per_req']:.3f}x"
    )
    if "direct" in cells:
        added = edge["latency_ms"]["p50"] - cells["direct"]["latency_ms"]["p50"]
        text += f"  added p50 {added:.3f} ms"
    return text


def git_rev() -> str | None:
    """The checkout's revision (``+uncommitted`` when tracked files changed), or None."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], capture_output=True, text=True, check=True, cwd=ROOT)
        return done.stdout.strip()

    try:
        rev = git("rev-parse", "--short=12", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{rev}+uncommitted" if dirty else rev


def _meta(
    options: argparse.Namespace, info: dict[str, Any], elapsed: float, foreign: dict[str, float]
) -> dict[str, Any]:
    return {
        "command": " ".join(["bench/check.py", *options.argv]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "git_rev": git_rev(),
        "cpu": info["cpu"],
        "cores": info["cores"],
        "kernel": platform.release(),
        "python": info["python"],
        "aiohttp": info["aiohttp"],
        "iop_edge": metadata.version("iop-edge"),
        "pinned": info["pinning"].startswith("taskset"),
        "pinning": info["pinning"],
        "engine": "python",
        "load_generator": info["load_generator"],
        "upstream": info["upstream"],
        "rounds": options.rounds,
        "duration_s": options.duration,
        "warmup_s": options.warmup,
        "elapsed_s": round(elapsed, 1),
        "other_work_pct": foreign,
    }


# -- command line ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The command line of the check."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None,
        epilog="Exit status: 0 pass, 1 regression, 2 broken run or unusable baseline.",
    )
    parser.add_argument("--baseline", type=Path, default=BASELINE, help="the committed figures")
    parser.add_argument(
        "--tolerance",
        type=float,
        default=0.10,
        help="how much worse (relative) a figure may be before the check fails (default 0.10)",
    )
    parser.add_argument(
        "--p50-floor-ms",
        type=float,
        default=0.01,
        help="an added p50 fails only when it also grew by more than this (default 0.01 ms)",
    )
    parser.add_argument(
        "--max-other-work",
        type=float,
        default=MAX_OTHER_WORK_PCT,
        metavar="PCT",
        help="a run during which other processes took more than PCT %% of one of its cores is "
        f"broken, not judged (default {MAX_OTHER_WORK_PCT:.0f})",
    )
    parser.add_argument(
        "--update", action="store_true", help="measure and write the baseline instead"
    )
    parser.add_argument(
        "--compare", type=Path, metavar="FILE", help="judge a saved run instead of measuring"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        help=f"interleaved rounds (default {CHECK_ROUNDS}; {UPDATE_ROUNDS} with --update)",
    )
    parser.add_argument(
        "--duration", type=float, default=0.5, help="measured seconds per cell (default 0.5)"
    )
    parser.add_argument(
        "--warmup", type=float, default=0.1, help="warm-up seconds per cell (default 0.1)"
    )
    parser.add_argument("--no-pin", action="store_true", help="do not use taskset")
    parser.add_argument("--output", type=Path, default=RESULTS, help="where the run's JSON goes")
    return parser


def parse_options(argv: list[str]) -> argparse.Namespace:
    """Parse and check the options (argparse exits 2 on a bad one)."""
    parser = build_parser()
    options = parser.parse_args(argv)
    options.argv = argv
    if not 0 <= options.tolerance < 1:
        parser.error(f"--tolerance: {options.tolerance} is not in [0, 1); 0.10 is 10 %")
    if options.p50_floor_ms < 0:
        parser.error(f"--p50-floor-ms: {options.p50_floor_ms} is negative")
    if options.rounds is None:
        options.rounds = UPDATE_ROUNDS if options.update else CHECK_ROUNDS
    if options.rounds < 1:
        parser.error(f"--rounds: {options.rounds} is not >= 1")
    if options.duration <= 0 or options.warmup < 0:
        parser.error("--duration must be > 0 and --warmup >= 0")
    if options.update and options.compare:
        parser.error("--update measures a new baseline; --compare judges a saved run: pick one")
    return options


def load(path: Path, what: str) -> Figures:
    """Read and validate a figures file (raises :class:`FiguresError` naming the file)."""
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError as exc:
        hint = " (write one with `make bench-baseline`)" if what == "baseline" else ""
        raise FiguresError(f"{path}: no such {what} file{hint}") from exc
    except (OSError, ValueError) as exc:
        raise FiguresError(f"{path}: the {what} cannot be read as JSON: {exc}") from exc
    return parse_figures(document, str(path))


def _write(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")


def _relative(path: Path) -> str:
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def _figures_table(figures: Figures) -> str:
    lines = [
        "| cell | iop-edge CPU µs/req | pass-through CPU µs/req | ratio (per round) | "
        "added p50 ms (per round) |",
        "| --- | ---: | ---: | --- | --- |",
    ]
    for cell in figures.cells:
        ratios = ", ".join(f"{v:.3f}" for v in cell.rounds.get("cpu_ratio", []))
        added = ", ".join(f"{v:.3f}" for v in cell.rounds.get("added_p50_ms", []))
        p50 = "—" if cell.added_p50_ms is None else f"{cell.added_p50_ms:.3f} ({added})"
        lines.append(
            f"| {cell.key} | {cell.edge_cpu_us_per_req:.1f} | "
            f"{cell.passthrough_cpu_us_per_req:.1f} | {cell.cpu_ratio:.3f}x ({ratios}) | {p50} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Measure (or read) the figures, judge them, print the table; the exit status."""
    options = parse_options(sys.argv[1:] if argv is None else argv)
    baseline: Figures | None = None
    if not options.update:
        try:
            baseline = load(options.baseline, "baseline")
        except FiguresError as exc:
            print(f"bench-check: broken: {exc}", file=sys.stderr)
            return EXIT_BROKEN
    if options.compare:
        try:
            current = load(options.compare, "run")
        except FiguresError as exc:
            print(f"bench-check: broken: {exc}", file=sys.stderr)
            return EXIT_BROKEN
    else:
        try:
            document = measure(options)
        except BrokenRun as exc:
            print(f"\nbench-check: broken run: {exc}", file=sys.stderr)
            return EXIT_BROKEN
        current = parse_figures(document, "this run")
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        saved = options.output / f"check-{stamp}.json"
        _write(saved, document)
        run_meta = document["meta"]
        print(f"\n{_figures_table(current)}\n")
        print(f"took {run_meta['elapsed_s']:.0f} s; figures written: {_relative(saved)}")
        if run_meta["elapsed_s"] > BUDGET_S and not options.update:
            print(f"note: over the {BUDGET_S:.0f} s budget of `make bench-check`")
        other = run_meta["other_work_pct"]
        if other:
            shares = ", ".join(f"{core} {pct:.0f} %" for core, pct in other.items())
            print(f"other work on the machine during the run: {shares}")
        if options.update:
            busy = busy_problem(run_meta, options.max_other_work)
            if busy:
                print(f"\nbench-check: broken run, no baseline written: {busy}", file=sys.stderr)
                return EXIT_BROKEN
            _write(options.baseline, document)
            print(f"baseline written: {_relative(options.baseline)} (commit it)")
            return EXIT_PASS
    assert baseline is not None
    comparison = compare(
        baseline, current, options.tolerance, options.p50_floor_ms, options.max_other_work
    )
    print(
        f"\nagainst {_relative(options.baseline)} (rev {baseline.meta.get('git_rev')}, "
        f"{baseline.meta.get('date')}), tolerance {percent(options.tolerance)}:\n"
    )
    print(render(comparison, options.tolerance))
    return exit_code(comparison)


if __name__ == "__main__":
    run_main(main)
