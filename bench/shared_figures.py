"""The figures of the shared pool benchmark (``bench/bench_shared.py``): what holding a lease in
a shared store costs a request, and what three replicas sharing one provider's capacity serve
against one, from the cells of interleaved rounds.

Pure: the rounds in, the figures and their tables out. Each figure is the median over the
rounds of a per-round value, each computed from cells measured seconds apart (as
``bench/nodes_figures.py`` does), so that a round the machine ran slower for all of them moves
none:

- **added p50** at concurrency 1, non-streaming and streaming: the p50 of the edge with
  ``provider_pool.shared`` minus that of the same edge without; target ≤
  :data:`ADDED_P50_MAX_MS`;
- **throughput** of three replicas sharing one provider (its capacity the bound: the fake
  upstream answers after a fixed delay) over one replica's at the same capacity, with
  ``shared`` and without; target ≥ :data:`THROUGHPUT_RATIO_MIN` for each;
- **CPU per request**, reported without a target: the edge's without ``shared`` and with it,
  the other replicas' (idle, but hearing every release), the store's (``redis-server``), and
  the whole with ``shared`` over the edge without; and the store's round trips per request.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

ADDED_P50_MAX_MS: Final = 1.0
THROUGHPUT_RATIO_MIN: Final = 0.95
EDGES: Final = ("without", "with")
"""The two edges of the per-request cells: the same config, without ``provider_pool.shared``
and with it."""
SETUPS: Final = ("one without", "one with", "three with")
"""The throughput cells: one replica without ``shared``, one with it, three with it (the load
spread evenly over them)."""
REPLICAS: Final = ("r1", "r2", "r3")
"""The edges with ``shared`` (``r1`` is the edge ``with`` of the per-request cells)."""
STORE: Final = "redis-server"


@dataclass(frozen=True)
class CellSpec:
    """One per-request cell, measured on each edge: mode and concurrency."""

    title: str
    stream: bool
    concurrency: int

    @property
    def key(self) -> str:
        """``stream c=1``: how the cell is named in the reports and the JSON."""
        return f"{self.title} c={self.concurrency}"


CELLS: Final = (
    CellSpec("plain", False, 1),
    CellSpec("stream", True, 1),
    CellSpec("plain", False, 16),
    CellSpec("stream", True, 16),
)
ADDED_P50_CELLS: Final = ("plain c=1", "stream c=1")
THROUGHPUT_RATIOS: Final = (("three with", "one without"), ("three with", "one with"))

Cell = dict[str, Any]
Rounds = dict[str, dict[str, list[Cell]]]
"""Cell key → edge → that cell in each round kept (the same rounds for every list)."""
Throughput = dict[str, list[Cell]]
"""Setup → its throughput cell in each round kept."""


def _p50(cells: Sequence[Cell]) -> list[float]:
    return [float(cell["latency_ms"]["p50"]) for cell in cells]


def _column(cells: Sequence[Cell], name: str) -> list[float]:
    return [float(cell[name]) for cell in cells]


def _median(values: Sequence[float], digits: int) -> float:
    return round(statistics.median(values), digits)


def _per_round(values: Sequence[float], digits: int) -> list[float]:
    return [round(value, digits) for value in values]


def added_p50(rounds: Rounds, key: str) -> dict[str, Any]:
    """The edge with ``shared``'s p50 over the edge without's in cell ``key``, per round and
    median."""
    without, with_ = _p50(rounds[key]["without"]), _p50(rounds[key]["with"])
    added = [far - near for near, far in zip(without, with_, strict=True)]
    median = statistics.median(added)
    return {
        "figure": f"added p50, {key}",
        "cell": key,
        "unit": "ms",
        "base": _median(without, 3),
        "value_of": _median(with_, 3),
        "value": round(median, 3),
        "rounds": _per_round(added, 3),
        "target": f"<= {ADDED_P50_MAX_MS} ms",
        "met": median <= ADDED_P50_MAX_MS,
    }


def throughput_ratio(cells: Throughput, setup: str, base: str) -> dict[str, Any]:
    """``setup``'s requests per second over ``base``'s, per round and median."""
    over, under = _column(cells[setup], "finished_rps"), _column(cells[base], "finished_rps")
    ratios = [a / b for a, b in zip(over, under, strict=True)]
    median = statistics.median(ratios)
    return {
        "figure": f"throughput, {setup} / {base}",
        "cell": f"{setup} / {base}",
        "unit": "req/s",
        "base": _median(under, 1),
        "value_of": _median(over, 1),
        "value": round(median, 4),
        "rounds": _per_round(ratios, 4),
        "target": f">= {THROUGHPUT_RATIO_MIN}x",
        "met": median >= THROUGHPUT_RATIO_MIN,
    }


def _others(cell: Cell, names: Sequence[str]) -> float:
    """The CPU per request of the processes ``names`` (from the cell's ``others_cpu_s``)."""
    seconds = sum(float(cell["others_cpu_s"].get(name, 0.0)) for name in names)
    return seconds / max(1, int(cell["total_completed"])) * 1e6


def cpu_row(rounds: Rounds, key: str) -> dict[str, Any]:
    """CPU per request in cell ``key`` (µs): the edge without ``shared``; with it, the edge,
    the other replicas (listening) and the store; the whole with over the edge without (per
    round, median); the store's scripts run per request."""
    without = _column(rounds[key]["without"], "cpu_us_per_req")
    cells = rounds[key]["with"]
    edge = _column(cells, "cpu_us_per_req")
    listeners = [_others(cell, REPLICAS[1:]) for cell in cells]
    store = [_others(cell, (STORE,)) for cell in cells]
    whole = [a + b + c for a, b, c in zip(edge, listeners, store, strict=True)]
    ratios = [far / near for near, far in zip(without, whole, strict=True)]
    return {
        "cell": key,
        "without_edge_us": _median(without, 1),
        "with_edge_us": _median(edge, 1),
        "with_listeners_us": _median(listeners, 1),
        "with_store_us": _median(store, 1),
        "with_total_us": _median(whole, 1),
        "ratio": _median(ratios, 4),
        "rounds": _per_round(ratios, 4),
        "store_calls_per_req": _median(_column(cells, "store_calls_per_req"), 2),
    }


def throughput_row(cells: Throughput, setup: str) -> dict[str, Any]:
    """One throughput setup: req/s, share of the ideal, CPU per request (µs) of every edge
    together and of the store, the store's scripts run per request."""
    edges = [
        float(cell["cpu_us_per_req"]) + _others(cell, ("solo", *REPLICAS)) for cell in cells[setup]
    ]
    return {
        "setup": setup,
        "rps": _median(_column(cells[setup], "finished_rps"), 1),
        "of_ideal": _median(_column(cells[setup], "of_ideal"), 4),
        "edges_us": _median(edges, 1),
        "store_us": _median([_others(cell, (STORE,)) for cell in cells[setup]], 1),
        "store_calls_per_req": _median(_column(cells[setup], "store_calls_per_req"), 2),
        "rounds_rps": _per_round(_column(cells[setup], "finished_rps"), 1),
    }


def figures(rounds: Rounds, throughput: Throughput, ideal_rps: float) -> dict[str, Any]:
    """Every figure of the cells measured (a figure whose cells are missing is left out)."""
    targets = [added_p50(rounds, key) for key in ADDED_P50_CELLS if key in rounds]
    targets += [
        throughput_ratio(throughput, setup, base)
        for setup, base in THROUGHPUT_RATIOS
        if setup in throughput and base in throughput
    ]
    return {
        "targets": targets,
        "cpu": [cpu_row(rounds, spec.key) for spec in CELLS if spec.key in rounds],
        "throughput": [throughput_row(throughput, s) for s in SETUPS if s in throughput],
        "ideal_rps": round(ideal_rps, 1),
    }


def all_met(result: dict[str, Any]) -> bool:
    """Whether every figure with a target met it."""
    return all(row["met"] for row in result["targets"])


def _value(row: dict[str, Any], name: str) -> str:
    value = row[name]
    return f"{value:,.1f} req/s" if row["unit"] == "req/s" else f"{value:.3f} ms"


def markdown(result: dict[str, Any], *, capacity: int, delay_ms: float) -> str:
    """The tables (the headline ``make bench`` repeats at the end)."""
    lines = [
        "#### An edge with a shared store on loopback against the same edge without "
        "(same fake, same run)\n",
        "| figure | base | with `shared` | change (per round) | target |",
        "| --- | ---: | ---: | --- | --- |",
    ]
    for row in result["targets"]:
        if row["unit"] == "ms":
            change = f"{row['value']:+.3f} ms (" + ", ".join(f"{v:+.3f}" for v in row["rounds"])
        else:
            change = f"{row['value']:.3f}x (" + ", ".join(f"{v:.3f}" for v in row["rounds"])
        verdict = "met" if row["met"] else "**missed**"
        lines.append(
            f"| {row['figure']} | {_value(row, 'base')} | {_value(row, 'value_of')} | "
            f"{change}) | {row['target'].replace('<=', '≤').replace('>=', '≥')} {verdict} |"
        )
    lines += [
        "\n#### CPU per request (µs): the edge without `shared`; with it, the edge, the two "
        "other replicas (hearing its releases) and the store\n",
        "| cell | without: edge | with: edge | with: other replicas | with: store | "
        "with: all | all / without (per round) | store scripts / req |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for row in result["cpu"]:
        per_round = ", ".join(f"{v:.2f}" for v in row["rounds"])
        lines.append(
            f"| {row['cell']} | {row['without_edge_us']:,.0f} | {row['with_edge_us']:,.0f} | "
            f"{row['with_listeners_us']:,.0f} | {row['with_store_us']:,.0f} | "
            f"{row['with_total_us']:,.0f} | {row['ratio']:.2f}x ({per_round}) | "
            f"{row['store_calls_per_req']:.2f} |"
        )
    if result["throughput"]:
        lines += [
            f"\n#### One provider of capacity {capacity}, the fake answering after "
            f"{delay_ms:g} ms (ideal {result['ideal_rps']:,.0f} req/s), "
            f"{3 * capacity} client loops\n",
            "| setup | req/s (per round) | of the ideal | edges' CPU / req (µs) | "
            "store's CPU / req (µs) | store scripts / req |",
            "| --- | --- | ---: | ---: | ---: | ---: |",
        ]
        for row in result["throughput"]:
            per_round = ", ".join(f"{v:.0f}" for v in row["rounds_rps"])
            lines.append(
                f"| {row['setup']} | {row['rps']:,.1f} ({per_round}) | {row['of_ideal']:.1%} | "
                f"{row['edges_us']:,.0f} | {row['store_us']:,.0f} | "
                f"{row['store_calls_per_req']:.2f} |"
            )
    return "\n".join(lines)
