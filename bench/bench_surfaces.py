"""Benchmark (issues 27 and 28): Anthropic Messages and OpenAI Responses through iop-edge against
chat on the same provider.

One ``iop-edge serve`` (the proxy benchmark's config: auth on, metrics on, the JSON request log
at info) with two model groups on the same fake upstream (``iop_edge.testing.fake_openai``, 16
content chunks per answer, in its own process): ``bench-model``, an ``openai_compat`` chat
provider, where a ``POST /v1/messages`` or ``POST /v1/responses`` is **translated** to chat and
back, and ``bench-native``, the same provider with ``native_apis: [messages, responses]``, where
it is **passed through** to the fake's own ``/v1/messages`` (16 ``text_delta`` events) or
``/v1/responses`` (16 ``response.output_text.delta`` events). The same prompt and maximum of
tokens in every scenario, so the same reply in the same 16 pieces. The load is
``bench/loadgen.py`` (``--api chat``, ``messages`` or ``responses``, the Python engine, closed
loop), the CPU is the edge process's CPU time over the requests it completed, and the pinning
is the proxy benchmark's (the edge on core 1; the fake, the load and this driver on core 0):

===============================  ===========================================================
scenario                         what is sent
===============================  ===========================================================
``chat``                         ``POST /v1/chat/completions`` to ``bench-model``
``messages-translated``          ``POST /v1/messages`` to ``bench-model`` (translated)
``messages-passthrough``         ``POST /v1/messages`` to ``bench-native`` (passed through)
``responses-translated``         ``POST /v1/responses``, ``store: false``, to ``bench-model``
                                 (translated)
``responses-translated-stored``  the same with ``store: true``: the edge keeps each response
                                 (its default store: 1,000 responses, 64 MiB)
``responses-passthrough``        ``POST /v1/responses``, ``store: false``, to ``bench-native``
                                 (passed through)
``chat-native``                  ``POST /v1/chat/completions`` to ``bench-native``: chat on
                                 the passthrough provider, the same work as ``chat`` — its
                                 ratio to ``chat`` shows the run's noise
``direct-chat``                  the fake's ``/v1/chat/completions`` directly (latency only)
``direct-messages``              the fake's ``/v1/messages`` directly (latency only)
``direct-responses``             the fake's ``/v1/responses`` directly (latency only)
===============================  ===========================================================

``--api messages,responses`` (the default) says which surfaces are measured; the chat scenarios
are measured with either. Each round measures, one cell after the other: streaming at
concurrency 16 (every edge scenario), streaming at concurrency 1 (``chat``, each surface's modes
without the store, and the direct ones), non-streaming at concurrency 16 (``chat`` and each
translated surface); within a group the order is a Williams design, so that over the rounds
every scenario is measured in every position and after every other one alike. The figures are
medians over the rounds of per-round values (each a pair measured seconds apart):

- CPU per request, a translated stream over a chat stream (c=16), Messages and Responses
  (with and without the store): target ≤ 1.3×;
- CPU per request, a passthrough stream over a chat stream on the passthrough provider
  (c=16), Messages and Responses: target ≤ 1.05×;
- added p50 at c=1 (the edge's p50 minus the upstream's own for the same work: the fake's chat
  for ``chat`` and the translated modes, its Messages or Responses for passthrough), of each
  mode against chat's in the same round (the median of the per-round differences): target
  "unchanged", judged as ``make bench-check`` judges an added p50 (not more than 10 % and
  0.01 ms above chat's);
- reported without a target: the store's cost (stored over not stored), the non-streamed
  translated/chat ratios, the c=1 ratios, the control ratio.

Other work on the run's two cores is measured in each round (``/proc/stat`` minus the run's own
processes, as ``make bench-check`` does over its run): a round during which it took more than
15 % of a core is thrown away and measured again, up to ``--rounds`` more times. Prints the
tables and writes ``bench/results/surfaces-<time>.json``; exit status 0 when every target is
met, 1 when one is missed, 2 when the run is broken (a target did not start, a request failed,
a cell measured nothing, no round was quiet).

    .venv/bin/python bench/bench_surfaces.py                 # about 3 minutes on 2 cores
    .venv/bin/python bench/bench_surfaces.py --api responses --rounds 3 --duration 0.5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

sys.path.insert(0, str(Path(__file__).resolve().parent))

from check import BrokenRun, git_rev, measure_cell, quiet_rounds
from peers import (
    MODEL,
    NATIVE_MODEL,
    ProcessSet,
    Target,
    edge_config,
    free_port,
    new_principal_token,
    run_main,
    start_edge,
    start_fake,
)
from proxy_bench import RESULTS, Bench, meta
from proxy_bench import parse_options as proxy_bench_options
from regression import judge

EXIT_MET: Final = 0
EXIT_MISSED: Final = 1
EXIT_BROKEN: Final = 2
MAX_OTHER_WORK_PCT: Final = 15.0
P50_TOLERANCE: Final = 0.10
P50_FLOOR_MS: Final = 0.01
SURFACES: Final = {"messages": "Anthropic Messages", "responses": "OpenAI Responses"}
"""The surfaces measured against chat (``--api``), and how the tables name them."""


@dataclass(frozen=True)
class Scenario:
    """What one scenario sends, and to whom: the edge or the fake directly."""

    name: str
    api: str
    """``bench/loadgen.py --api``: ``chat``, ``messages`` or ``responses``."""
    model: str
    direct: bool = False
    store: bool = False
    """``bench/loadgen.py --store``: Responses' ``store: true``."""

    @property
    def surface(self) -> str | None:
        """The surface it measures (``None``: chat, measured with any surface)."""
        return None if self.api == "chat" else self.api


SCENARIOS: Final = {
    s.name: s
    for s in (
        Scenario("chat", "chat", MODEL),
        Scenario("messages-translated", "messages", MODEL),
        Scenario("messages-passthrough", "messages", NATIVE_MODEL),
        Scenario("responses-translated", "responses", MODEL),
        Scenario("responses-translated-stored", "responses", MODEL, store=True),
        Scenario("responses-passthrough", "responses", NATIVE_MODEL),
        Scenario("chat-native", "chat", NATIVE_MODEL),
        Scenario("direct-chat", "chat", MODEL, direct=True),
        Scenario("direct-messages", "messages", MODEL, direct=True),
        Scenario("direct-responses", "responses", MODEL, direct=True),
    )
}


@dataclass(frozen=True)
class CellGroup:
    """Cells measured back to back in a round: one mode and concurrency, several scenarios."""

    stream: bool
    concurrency: int
    scenarios: tuple[str, ...]

    @property
    def key(self) -> str:
        """``stream c=16``: how the group is named in the reports."""
        return f"{'stream' if self.stream else 'plain'} c={self.concurrency}"


GROUPS: Final = (
    CellGroup(
        True,
        16,
        (
            "chat",
            "messages-translated",
            "messages-passthrough",
            "responses-translated",
            "responses-translated-stored",
            "responses-passthrough",
            "chat-native",
        ),
    ),
    CellGroup(
        True,
        1,
        (
            "direct-chat",
            "direct-messages",
            "direct-responses",
            "chat",
            "messages-translated",
            "messages-passthrough",
            "responses-translated",
            "responses-passthrough",
        ),
    ),
    CellGroup(False, 16, ("chat", "messages-translated", "responses-translated")),
)
"""Every group with every surface's scenarios (:func:`groups` keeps those of ``--api``)."""


def groups(surfaces: Sequence[str]) -> tuple[CellGroup, ...]:
    """:data:`GROUPS` with only the chat scenarios and those of ``surfaces``."""
    return tuple(
        CellGroup(
            group.stream,
            group.concurrency,
            tuple(name for name in group.scenarios if SCENARIOS[name].surface in (None, *surfaces)),
        )
        for group in GROUPS
    )


@dataclass(frozen=True)
class CpuRatio:
    """A figure: the median over the rounds of one scenario's CPU per request over another's."""

    label: str
    group: str
    numerator: str
    denominator: str
    target: float | None = None


CPU_RATIOS: Final = (
    CpuRatio(
        "translated Messages / chat, streaming", "stream c=16", "messages-translated", "chat", 1.3
    ),
    CpuRatio(
        "passthrough Messages / chat on the passthrough provider, streaming",
        "stream c=16",
        "messages-passthrough",
        "chat-native",
        1.05,
    ),
    CpuRatio(
        "translated Responses, store: false / chat, streaming",
        "stream c=16",
        "responses-translated",
        "chat",
        1.3,
    ),
    CpuRatio(
        "translated Responses, store: true / chat, streaming",
        "stream c=16",
        "responses-translated-stored",
        "chat",
        1.3,
    ),
    CpuRatio(
        "passthrough Responses / chat on the passthrough provider, streaming",
        "stream c=16",
        "responses-passthrough",
        "chat-native",
        1.05,
    ),
    CpuRatio(
        "control: chat on the passthrough provider / chat", "stream c=16", "chat-native", "chat"
    ),
    CpuRatio(
        "the store: translated Responses, store: true / store: false, streaming",
        "stream c=16",
        "responses-translated-stored",
        "responses-translated",
    ),
    CpuRatio(
        "translated Messages / chat, non-streaming", "plain c=16", "messages-translated", "chat"
    ),
    CpuRatio(
        "translated Responses / chat, non-streaming", "plain c=16", "responses-translated", "chat"
    ),
    CpuRatio("translated Messages / chat, streaming", "stream c=1", "messages-translated", "chat"),
    CpuRatio(
        "passthrough Messages / chat, streaming", "stream c=1", "messages-passthrough", "chat"
    ),
    CpuRatio(
        "translated Responses / chat, streaming", "stream c=1", "responses-translated", "chat"
    ),
    CpuRatio(
        "passthrough Responses / chat, streaming", "stream c=1", "responses-passthrough", "chat"
    ),
)
"""Every figure; :func:`figures` makes those whose two scenarios were measured."""

ADDED_P50: Final = (
    ("chat", "chat", "direct-chat"),
    ("messages, translated", "messages-translated", "direct-chat"),
    ("messages, passthrough", "messages-passthrough", "direct-messages"),
    ("responses, translated", "responses-translated", "direct-chat"),
    ("responses, passthrough", "responses-passthrough", "direct-responses"),
)
"""(label, edge scenario, the direct scenario doing the same upstream work) at stream c=1."""
ADDED_P50_GROUP: Final = "stream c=1"


def round_order(names: Sequence[str], round_index: int) -> list[str]:
    """The order of ``names`` in round ``round_index``: a Williams design.

    Over ``n`` rounds (``2n`` for an odd ``n``; over ``n`` of them each follows half the others,
    twice each) each name takes every position, and follows every other name equally often.
    Turning the order by one each round gave every position but always the same neighbour, so
    whatever a cell leaves to the next (or spares it) fell on the same scenario in every round:
    ``store: true``, always measured right after ``store: false``, came out 6 % cheaper than it
    in two runs, though it does more.
    """
    n = len(names)
    first, low, high = [0], 1, n - 1
    while len(first) < n:  # 0, 1, n-1, 2, n-2, ...: each difference once
        if len(first) % 2:
            first.append(low)
            low += 1
        else:
            first.append(high)
            high -= 1
    step = round_index % (2 * n if n % 2 else n)
    row = [names[(i + step) % n] for i in first]
    return row[::-1] if step >= n else row  # (an odd n: the mirrored square second)


# -- the figures (pure: from the rounds' cells) ----------------------------------------------


Rounds = dict[str, dict[str, list[dict[str, Any]]]]
"""group key → scenario → its cell in each round, in round order."""


def _cpu(rounds: Rounds, group: str, scenario: str) -> list[float]:
    return [float(cell["cpu_us_per_req"]) for cell in rounds[group][scenario]]


def _p50(rounds: Rounds, group: str, scenario: str) -> list[float]:
    return [float(cell["latency_ms"]["p50"]) for cell in rounds[group][scenario]]


def _measured(rounds: Rounds, group: str, *scenarios: str) -> bool:
    return all(name in rounds.get(group, {}) for name in scenarios)


def figures(rounds: Rounds) -> dict[str, Any]:
    """The CPU ratios and the added p50s of the scenarios measured, with their per-round values
    and verdicts; and the surfaces they were of (in :data:`SURFACES`' order)."""
    measured = {SCENARIOS[name].surface for scenarios in rounds.values() for name in scenarios}
    cpu_rows = []
    for ratio in CPU_RATIOS:
        if not _measured(rounds, ratio.group, ratio.numerator, ratio.denominator):
            continue
        top = _cpu(rounds, ratio.group, ratio.numerator)
        bottom = _cpu(rounds, ratio.group, ratio.denominator)
        per_round = [a / b for a, b in zip(top, bottom, strict=True)]
        median = statistics.median(per_round)
        cpu_rows.append(
            {
                "figure": ratio.label,
                "cell": ratio.group,
                "scenarios": [ratio.numerator, ratio.denominator],
                "cpu_us_per_req": [
                    round(statistics.median(top), 1),
                    round(statistics.median(bottom), 1),
                ],
                "ratio": round(median, 4),
                "rounds": [round(value, 4) for value in per_round],
                "target": ratio.target,
                "met": None if ratio.target is None else median <= ratio.target,
            }
        )
    pairs = [
        (label, scenario, upstream)
        for label, scenario, upstream in ADDED_P50
        if _measured(rounds, ADDED_P50_GROUP, scenario, upstream)
    ]
    added = {
        label: [
            edge - direct
            for edge, direct in zip(
                _p50(rounds, ADDED_P50_GROUP, scenario),
                _p50(rounds, ADDED_P50_GROUP, upstream),
                strict=True,
            )
        ]
        for label, scenario, upstream in pairs
    }
    chat = statistics.median(added["chat"])
    p50_rows = []
    for label, scenario, upstream in pairs:
        median = statistics.median(added[label])
        row: dict[str, Any] = {
            "figure": label,
            "scenarios": [scenario, upstream],
            "added_p50_ms": round(median, 3),
            "rounds": [round(value, 3) for value in added[label]],
        }
        if scenario != "chat":
            # Against chat's in the same round (cells seconds apart), as the CPU ratios are:
            # the difference of the two medians mixes rounds the machine ran at other speeds.
            against = statistics.median(
                [mine - chats for mine, chats in zip(added[label], added["chat"], strict=True)]
            )
            change, verdict = judge(chat, chat + against, P50_TOLERANCE, P50_FLOOR_MS)
            row["against_chat_ms"] = round(against, 3)
            row["against_chat_rounds"] = [
                round(mine - chats, 3)
                for mine, chats in zip(added[label], added["chat"], strict=True)
            ]
            row["change"] = round(change, 4)
            row["met"] = verdict != "WORSE"
        p50_rows.append(row)
    return {
        "surfaces": [surface for surface in SURFACES if surface in measured],
        "cpu": cpu_rows,
        "added_p50": p50_rows,
    }


def all_met(result: dict[str, Any]) -> bool:
    """Whether every figure with a target met it."""
    rows = [*result["cpu"], *result["added_p50"]]
    return all(row.get("met") is not False for row in rows)


def markdown(result: dict[str, Any]) -> str:
    """The two tables (the headline ``make bench`` repeats at the end)."""
    surfaces = " and ".join(SURFACES[surface] for surface in result["surfaces"])
    lines = [
        f"#### {surfaces} against chat on the same provider (CPU per request, same run)\n",
        "| figure | cell | CPU µs/req | ratio (per round) | target |",
        "| --- | --- | ---: | --- | --- |",
    ]
    for row in result["cpu"]:
        rounds = ", ".join(f"{value:.2f}" for value in row["rounds"])
        target = "—" if row["target"] is None else f"≤ {row['target']:.2f}x"
        if row["met"] is not None:
            target += " met" if row["met"] else " **missed**"
        top, bottom = row["cpu_us_per_req"]
        lines.append(
            f"| {row['figure']} | {row['cell']} | {top:.0f} / {bottom:.0f} | "
            f"{row['ratio']:.3f}x ({rounds}) | {target} |"
        )
    lines += [
        "\n#### Added p50 at concurrency 1, streaming (the edge's p50 minus the upstream's own)\n",
        "| requests | added p50 ms (per round) | against chat (same round) | target |",
        "| --- | --- | ---: | --- |",
    ]
    for row in result["added_p50"]:
        rounds = ", ".join(f"{value:.3f}" for value in row["rounds"])
        if "met" in row:
            against = f"{row['against_chat_ms']:+.3f} ms ({row['change']:+.1%})"
            verdict = "unchanged: " + ("met" if row["met"] else "**missed**")
        else:
            against, verdict = "", ""
        lines.append(
            f"| {row['figure']} | {row['added_p50_ms']:.3f} ({rounds}) | {against} | {verdict} |"
        )
    return "\n".join(lines)


# -- measuring -------------------------------------------------------------------------------


def _measure_round(
    bench: Bench, edge: Target, cell_groups: Sequence[CellGroup], round_index: int, label: str
) -> dict[str, dict[str, dict[str, Any]]]:
    """Every group's cells once, in this round's order: group key → scenario → cell."""
    assert bench.fake is not None
    cells: dict[str, dict[str, dict[str, Any]]] = {}
    for group in cell_groups:
        line = []
        for name in round_order(group.scenarios, round_index):
            scenario = SCENARIOS[name]
            cell = measure_cell(
                bench,
                bench.fake if scenario.direct else edge,
                group.stream,
                group.concurrency,
                api=scenario.api,
                model=scenario.model,
                store=scenario.store,
                label=f"{name} {group.key}",
            )
            cell["scenario"] = name
            cells.setdefault(group.key, {})[name] = cell
            shown = (
                f"p50 {cell['latency_ms']['p50']:.3f} ms"
                if scenario.direct
                else f"{cell['cpu_us_per_req']:.0f} µs"
            )
            line.append(f"{name} {shown}")
        print(f"  {label} {group.key:<11} " + "; ".join(line), flush=True)
    return cells


def measure(options: argparse.Namespace) -> tuple[Rounds, dict[str, Any]]:
    """Start the fake and the edge, run the rounds; the cells and the run's meta.

    A round during which other work took more than ``--max-other-work`` % of one of the run's
    cores is measured again (:func:`check.quiet_rounds`).
    """
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
    workdir = Path(tempfile.mkdtemp(prefix="iop-bench-surfaces-"))
    cell_groups = groups(options.api)
    rounds: Rounds = {group.key: {name: [] for name in group.scenarios} for group in cell_groups}
    started = time.monotonic()
    with ProcessSet() as processes:
        bench = Bench(bench_options, processes, workdir)
        bench.echo = False
        proxy_core = int(bench.proxy_cores) if bench.proxy_cores else None
        load_core = int(bench.load_cores) if bench.load_cores else None
        if load_core is not None:
            os.sched_setaffinity(0, {load_core})
        info = meta(bench)
        print(f"pinning: {info['pinning']}; logs: {workdir}", flush=True)
        try:
            bench.fake = start_fake(processes, workdir, bench.load_cores)
            token, digest = new_principal_token()
            config = edge_config(
                bench.fake.base_url, port=free_port(), token_hash=digest, native_group=True
            )
            edge = start_edge(processes, workdir, bench.proxy_cores, config, token)
        except (RuntimeError, TimeoutError, OSError) as exc:
            raise BrokenRun(f"a target did not start: {exc}") from exc
        assert edge.process is not None
        assert bench.fake.process is not None
        running = {}
        if proxy_core is not None and load_core is not None:
            running = {proxy_core: [edge.process], load_core: [bench.fake.process]}
        done = quiet_rounds(
            options.rounds,
            lambda index, label: _measure_round(bench, edge, cell_groups, index, label),
            proxy_core=proxy_core,
            load_core=load_core,
            running=running,
            max_other_work=options.max_other_work,
        )
    for cells in done.results:
        for key, scenarios in cells.items():
            for name, cell in scenarios.items():
                rounds[key][name].append(cell)
    info.update(
        command=" ".join(["bench/bench_surfaces.py", *options.argv]),
        git_rev=git_rev(),
        upstream=(
            "iop_edge.testing.fake_openai --behavior chunks=16 (chat, native Messages and "
            "native Responses)"
        ),
        load_generator="bench/loadgen.py --engine python (--api chat | messages | responses)",
        surfaces=list(options.api),
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
        "--duration", type=float, default=1.0, help="measured seconds per cell (default 1.0)"
    )
    parser.add_argument(
        "--warmup", type=float, default=0.2, help="warm-up seconds per cell (default 0.2)"
    )
    parser.add_argument(
        "--max-other-work",
        type=float,
        default=MAX_OTHER_WORK_PCT,
        metavar="PCT",
        help="a round during which other processes took more than PCT %% of one of its cores "
        f"is measured again (default {MAX_OTHER_WORK_PCT:.0f})",
    )
    parser.add_argument(
        "--api",
        default=",".join(SURFACES),
        help=f"the surfaces measured against chat, comma-separated (default {','.join(SURFACES)})",
    )
    parser.add_argument("--no-pin", action="store_true", help="do not use taskset")
    parser.add_argument("--output", type=Path, default=RESULTS, help="where the run's JSON goes")
    options = parser.parse_args(argv)
    options.argv = argv
    if options.rounds < 1:
        parser.error(f"--rounds: {options.rounds} is not >= 1")
    if options.duration <= 0 or options.warmup < 0:
        parser.error("--duration must be > 0 and --warmup >= 0")
    surfaces = [name.strip() for name in options.api.split(",") if name.strip()]
    unknown = [name for name in surfaces if name not in SURFACES]
    if unknown or not surfaces:
        parser.error(
            f"--api: {options.api!r} is not a list of surfaces; each must be one of "
            f"{', '.join(SURFACES)}"
        )
    options.api = [surface for surface in SURFACES if surface in surfaces]
    return options


def main(argv: list[str] | None = None) -> int:
    """Measure, print the tables, write the JSON; the exit status."""
    options = parse_options(sys.argv[1:] if argv is None else argv)
    try:
        rounds, info = measure(options)
    except BrokenRun as exc:
        print(f"\nbench_surfaces: broken run: {exc}", file=sys.stderr)
        return EXIT_BROKEN
    result = figures(rounds)
    text = markdown(result)
    print(f"\n{text}\n")
    if info["rounds"] < info["rounds_asked"]:
        print(
            f"only {info['rounds']} of {info['rounds_asked']} rounds were measured on a quiet "
            f"machine ({info['rounds_discarded_busy']} busy ones discarded)"
        )
    elif info["rounds_discarded_busy"]:
        print(f"{info['rounds_discarded_busy']} busy round(s) discarded and measured again")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = options.output / f"surfaces-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    cells = {group: dict(scenarios) for group, scenarios in rounds.items()}
    document = {"meta": info, "figures": result, "cells": cells, "headline_markdown": text}
    path.write_text(json.dumps(document, indent=2) + "\n")
    shown = path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
    print(f"took {info['elapsed_s']:.0f} s; written: {shown}")
    return EXIT_MET if all_met(result) else EXIT_MISSED


if __name__ == "__main__":
    run_main(main)
