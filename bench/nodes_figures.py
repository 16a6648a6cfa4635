"""The figures of the remote nodes benchmark (``bench/bench_nodes.py``, issue 29): what a request
through a remote node costs over the same provider local, from the cells of interleaved rounds.

Pure: the rounds in, the figures and their tables out. Each figure is the median over the
rounds of a per-round value, each computed from a local cell and a remote one measured seconds
apart (as ``bench/bench_surfaces.py`` does), so that a round the machine ran slower for both
moves neither:

- **added p50** at concurrency 1, non-streaming and streaming: the remote path's p50 minus the
  local path's; target ≤ :data:`ADDED_P50_MAX_MS`;
- **events per second** of long streams through one link at concurrency 16: the remote path's
  over the local path's; target ≥ :data:`EVENTS_RATIO_MIN`;
- **CPU per request**, reported without a target: the edge's on each path, the node's on the
  remote one, and the remote path's whole (edge + node) over the local path's.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

ADDED_P50_MAX_MS: Final = 1.0
EVENTS_RATIO_MIN: Final = 0.8
PATHS: Final = ("local", "remote")
"""The two paths to the same provider: in the edge's process, and over the node link."""


@dataclass(frozen=True)
class CellSpec:
    """One cell of a round, measured on each path: mode, concurrency and stream length."""

    title: str
    stream: bool
    concurrency: int
    chunks: int = 16
    """Content chunks per streamed answer (the fake's ``chunks``)."""

    @property
    def key(self) -> str:
        """``stream c=1``: how the cell is named in the reports and the JSON."""
        return f"{self.title} c={self.concurrency}"


LONG_CHUNKS: Final = 500
CELLS: Final = (
    CellSpec("plain", False, 1),
    CellSpec("stream", True, 1),
    CellSpec("plain", False, 16),
    CellSpec("stream", True, 16),
    CellSpec("long stream", True, 16, LONG_CHUNKS),
)
ADDED_P50_CELLS: Final = ("plain c=1", "stream c=1")
EVENTS_CELL: Final = "long stream c=16"

Cell = dict[str, Any]
Rounds = dict[str, dict[str, list[Cell]]]
"""Cell key → path → that cell in each round kept (the same rounds for every list)."""


def events_per_second(cell: Cell) -> float:
    """A streamed cell's throughput in events: the streams that ended in its window per second,
    times the events in each."""
    return float(cell["finished_rps"]) * int(cell["events_per_request"])


def _column(cells: Sequence[Cell], name: str) -> list[float]:
    return [float(cell[name]) for cell in cells]


def _p50(cells: Sequence[Cell]) -> list[float]:
    return [float(cell["latency_ms"]["p50"]) for cell in cells]


def _median(values: Sequence[float], digits: int) -> float:
    return round(statistics.median(values), digits)


def _per_round(values: Sequence[float], digits: int) -> list[float]:
    return [round(value, digits) for value in values]


def added_p50(rounds: Rounds, key: str) -> dict[str, Any]:
    """The remote path's p50 over the local path's in cell ``key``, per round and median."""
    local, remote = _p50(rounds[key]["local"]), _p50(rounds[key]["remote"])
    added = [far - near for near, far in zip(local, remote, strict=True)]
    median = statistics.median(added)
    return {
        "figure": f"added p50, {key}",
        "cell": key,
        "unit": "ms",
        "local": _median(local, 3),
        "remote": _median(remote, 3),
        "value": round(median, 3),
        "rounds": _per_round(added, 3),
        "target": f"<= {ADDED_P50_MAX_MS} ms",
        "met": median <= ADDED_P50_MAX_MS,
    }


def events_ratio(rounds: Rounds, key: str = EVENTS_CELL) -> dict[str, Any]:
    """The remote path's events per second over the local path's in cell ``key``."""
    local = [events_per_second(cell) for cell in rounds[key]["local"]]
    remote = [events_per_second(cell) for cell in rounds[key]["remote"]]
    ratios = [far / near for near, far in zip(local, remote, strict=True)]
    median = statistics.median(ratios)
    return {
        "figure": f"events/s through one link, {key}",
        "cell": key,
        "unit": "events/s",
        "local": _median(local, 0),
        "remote": _median(remote, 0),
        "value": round(median, 4),
        "rounds": _per_round(ratios, 4),
        "target": f">= {EVENTS_RATIO_MIN}x",
        "met": median >= EVENTS_RATIO_MIN,
    }


def cpu_row(rounds: Rounds, key: str) -> dict[str, Any]:
    """CPU per request in cell ``key``: the edge's on each path, the node's, and the remote
    path's whole over the local path's (per round, median)."""
    local = _column(rounds[key]["local"], "cpu_us_per_req")
    edge = _column(rounds[key]["remote"], "cpu_us_per_req")
    node = _column(rounds[key]["remote"], "node_cpu_us_per_req")
    whole = [a + b for a, b in zip(edge, node, strict=True)]
    ratios = [far / near for near, far in zip(local, whole, strict=True)]
    return {
        "cell": key,
        "local_edge_us": _median(local, 1),
        "remote_edge_us": _median(edge, 1),
        "remote_node_us": _median(node, 1),
        "remote_total_us": _median(whole, 1),
        "ratio": _median(ratios, 4),
        "rounds": _per_round(ratios, 4),
    }


BUSY: Final = {
    "edge": "core_pct",
    "node": "node_core_pct",
    "fake": "upstream_core_pct",
    "load": "client_core_pct",
}
"""What :func:`cores_busy` reports: each process's share of a core, from the cell's field."""


def cores_busy(rounds: Rounds, key: str = EVENTS_CELL) -> dict[str, dict[str, float]]:
    """Per path, the median share of one core (in %) each process took in cell ``key``: the
    edge, the node, the fake upstream and the load generator. With the placement, it says
    which core set the pace (the one near 100 %)."""
    return {
        path: {
            name: _median([float(cell[field]) for cell in rounds[key][path]], 1)
            for name, field in BUSY.items()
        }
        for path in PATHS
    }


def figures(rounds: Rounds) -> dict[str, Any]:
    """Every figure of the cells measured (a figure whose cell is missing is left out)."""
    targets = [added_p50(rounds, key) for key in ADDED_P50_CELLS if key in rounds]
    if EVENTS_CELL in rounds:
        targets.append(events_ratio(rounds))
    return {
        "targets": targets,
        "cpu": [cpu_row(rounds, spec.key) for spec in CELLS if spec.key in rounds],
        "cores_busy": cores_busy(rounds) if EVENTS_CELL in rounds else {},
    }


def all_met(result: dict[str, Any]) -> bool:
    """Whether every figure with a target met it."""
    return all(row["met"] for row in result["targets"])


def _value(row: dict[str, Any], name: str) -> str:
    value = row[name]
    return f"{value:,.0f}" if row["unit"] == "events/s" else f"{value:.3f} ms"


def markdown(result: dict[str, Any]) -> str:
    """The tables (the headline ``make bench`` repeats at the end)."""
    lines = [
        "#### A remote node on loopback against the same provider local (same fake, same run)\n",
        "| figure | local | remote | remote − local or remote / local (per round) | target |",
        "| --- | ---: | ---: | --- | --- |",
    ]
    for row in result["targets"]:
        if row["unit"] == "ms":
            change = f"{row['value']:+.3f} ms (" + ", ".join(f"{v:+.3f}" for v in row["rounds"])
        else:
            change = f"{row['value']:.3f}x (" + ", ".join(f"{v:.2f}" for v in row["rounds"])
        verdict = "met" if row["met"] else "**missed**"
        lines.append(
            f"| {row['figure']} | {_value(row, 'local')} | {_value(row, 'remote')} | "
            f"{change}) | {row['target'].replace('<=', '≤').replace('>=', '≥')} {verdict} |"
        )
    lines += [
        "\n#### CPU per request (µs): the edge's on each path, the node's on the remote one\n",
        "| cell | local: edge | remote: edge | remote: node | remote: edge + node | "
        "(edge + node) / local (per round) |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in result["cpu"]:
        rounds = ", ".join(f"{v:.2f}" for v in row["rounds"])
        lines.append(
            f"| {row['cell']} | {row['local_edge_us']:,.0f} | {row['remote_edge_us']:,.0f} | "
            f"{row['remote_node_us']:,.0f} | {row['remote_total_us']:,.0f} | "
            f"{row['ratio']:.2f}x ({rounds}) |"
        )
    busy = result["cores_busy"]
    if busy:
        shares = "; ".join(
            f"{path}: " + ", ".join(f"{name} {pct:.0f}" for name, pct in busy[path].items())
            for path in PATHS
        )
        lines.append(f"\nShare of one core (%) in {EVENTS_CELL}: {shares}")
    return "\n".join(lines)
