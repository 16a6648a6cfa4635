"""The verdict arithmetic of ``make bench-check``: committed figures + a run's figures → verdicts.

Pure (no I/O, no clock): :func:`parse_figures` validates a figures document (the committed
``bench/baseline.json`` or a check run's ``bench/results/check-*.json``), :func:`compare` checks
the run against the baseline, :func:`render` prints the table and :func:`exit_code` maps the
outcome to the command's exit status. ``bench/check.py`` measures; this module only judges.

A figures document::

    {"format": 1,
     "meta": {"engine": "python", "pinned": true, "cpu": "...", "cores": 2, ...},
     "cells": [{"mode": "plain", "concurrency": 1,
                "cpu_ratio": 1.63,                       # iop-edge / pass-through, CPU per request
                "edge_cpu_us_per_req": 268.0, "passthrough_cpu_us_per_req": 164.0,
                "added_p50_ms": 0.301,                   # iop-edge p50 - direct p50 (c=1 only)
                "direct_p50_ms": 0.193,                  # the upstream alone (c=1; not judged)
                "rounds": {"cpu_ratio": [...], ...}},     # the per-round values the medians are of
               ...]}

What is checked, per cell: ``cpu_ratio`` (every cell) and ``added_p50_ms`` (the cells that have
one: concurrency 1). Lower is better for both. A figure is **worse** when it exceeds the
baseline by more than ``tolerance`` (relative); for added p50 the increase must also exceed
``p50_floor_ms`` (a relative tolerance of a figure near zero would be finer than the
measurement). It is **better** when it is below the baseline by more than the tolerance (the
line can then be moved: ``--update``). The absolute CPU per request of each target is shown but
not judged: it follows the machine's state, the ratio of two targets measured side by side does
much less. Nor is the upstream's own p50: when it moved by more than the tolerance, a warning
says that the machine itself got faster or slower (the added p50 moves with it).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

FORMAT: Final = 1
MODES: Final = ("plain", "stream")
CHECKED: Final = ("cpu_ratio", "added_p50_ms")
"""The judged figures of a cell, in the order they are reported."""
LABELS: Final = {"cpu_ratio": "CPU/req ratio", "added_p50_ms": "added p50 ms"}

EXIT_PASS: Final = 0
EXIT_REGRESSION: Final = 1
EXIT_BROKEN: Final = 2

Verdict = Literal["ok", "better", "WORSE"]


class FiguresError(ValueError):
    """A figures document that cannot be used, with the path of the bad field and the rule."""


@dataclass(frozen=True)
class Cell:
    """One scenario's figures: the medians over the rounds, and the per-round values."""

    mode: str
    concurrency: int
    cpu_ratio: float
    edge_cpu_us_per_req: float
    passthrough_cpu_us_per_req: float
    added_p50_ms: float | None
    rounds: Mapping[str, Sequence[float]]
    direct_p50_ms: float | None = None
    """The upstream's own p50 (not judged: it tells whether the machine itself got slower)."""

    @property
    def key(self) -> str:
        """``plain c=1``, ``stream c=64``: how the cell is named in reports and errors."""
        return f"{self.mode} c={self.concurrency}"

    def figure(self, name: str) -> float | None:
        """A judged figure by name (see :data:`CHECKED`)."""
        value: float | None = getattr(self, name)
        return value


@dataclass(frozen=True)
class Figures:
    """A parsed figures document."""

    meta: Mapping[str, Any]
    cells: tuple[Cell, ...]

    def cell(self, key: str) -> Cell | None:
        """The cell named ``key``, or None."""
        return next((cell for cell in self.cells if cell.key == key), None)


@dataclass(frozen=True)
class Row:
    """One line of the verdict table."""

    cell: str
    figure: str
    baseline: float
    now: float
    change: float
    """Relative: now / baseline - 1 (``inf`` when the baseline is 0 and now is not)."""
    verdict: Verdict


@dataclass(frozen=True)
class Comparison:
    """Every judged figure, and what made the comparison impossible or doubtful."""

    rows: tuple[Row, ...]
    problems: tuple[str, ...]
    """The baseline and the run do not cover the same figures, or were measured differently
    in a way that makes the figures incomparable: the check is broken (exit 2)."""
    warnings: tuple[str, ...]
    """Differences that make the figures less comparable but not meaningless."""


def _number(value: object, path: str, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise FiguresError(f"{path}: {value!r} is not a finite number")
    if positive and value <= 0:
        raise FiguresError(f"{path}: {value!r} is not positive; a CPU figure must be > 0")
    return float(value)


def _cell(raw: object, path: str) -> Cell:
    if not isinstance(raw, Mapping):
        raise FiguresError(f"{path}: {raw!r} is not an object")
    mode = raw.get("mode")
    if mode not in MODES:
        raise FiguresError(f"{path}.mode: {mode!r} is not one of {', '.join(MODES)}")
    concurrency = raw.get("concurrency")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise FiguresError(f"{path}.concurrency: {concurrency!r} is not an integer >= 1")
    added = raw.get("added_p50_ms")
    direct = raw.get("direct_p50_ms")
    rounds = raw.get("rounds", {})
    if not isinstance(rounds, Mapping):
        raise FiguresError(f"{path}.rounds: {rounds!r} is not an object")
    return Cell(
        mode=str(mode),
        concurrency=concurrency,
        cpu_ratio=_number(raw.get("cpu_ratio"), f"{path}.cpu_ratio", positive=True),
        edge_cpu_us_per_req=_number(
            raw.get("edge_cpu_us_per_req"), f"{path}.edge_cpu_us_per_req", positive=True
        ),
        passthrough_cpu_us_per_req=_number(
            raw.get("passthrough_cpu_us_per_req"),
            f"{path}.passthrough_cpu_us_per_req",
            positive=True,
        ),
        added_p50_ms=None
        if added is None
        else _number(added, f"{path}.added_p50_ms", positive=False),
        rounds={str(k): list(v) for k, v in rounds.items() if isinstance(v, list)},
        direct_p50_ms=None
        if direct is None
        else _number(direct, f"{path}.direct_p50_ms", positive=True),
    )


def cell_from_rounds(
    mode: str,
    concurrency: int,
    edge_cpu_us: Sequence[float],
    passthrough_cpu_us: Sequence[float],
    edge_p50_ms: Sequence[float] | None = None,
    direct_p50_ms: Sequence[float] | None = None,
) -> dict[str, Any]:
    """A cell of a figures document from its rounds (the i-th values were measured together).

    The ratio is the median of the per-round ratios, each of two runs measured back to back
    (so both saw the same machine state), not the ratio of the medians; the added p50 likewise
    is the median of the per-round differences. The CPU figures are the medians of each target.
    """
    if not edge_cpu_us or len(edge_cpu_us) != len(passthrough_cpu_us):
        raise ValueError("edge_cpu_us and passthrough_cpu_us need the same, non-zero length")
    ratios = [edge / ceiling for edge, ceiling in zip(edge_cpu_us, passthrough_cpu_us, strict=True)]
    cell: dict[str, Any] = {
        "mode": mode,
        "concurrency": concurrency,
        "cpu_ratio": round(statistics.median(ratios), 4),
        "edge_cpu_us_per_req": round(statistics.median(edge_cpu_us), 1),
        "passthrough_cpu_us_per_req": round(statistics.median(passthrough_cpu_us), 1),
        "added_p50_ms": None,
        "rounds": {
            "cpu_ratio": [round(r, 4) for r in ratios],
            "edge_cpu_us_per_req": list(edge_cpu_us),
            "passthrough_cpu_us_per_req": list(passthrough_cpu_us),
        },
    }
    if edge_p50_ms is not None and direct_p50_ms is not None:
        if not edge_p50_ms or len(edge_p50_ms) != len(direct_p50_ms):
            raise ValueError("edge_p50_ms and direct_p50_ms need the same, non-zero length")
        added = [round(e - d, 3) for e, d in zip(edge_p50_ms, direct_p50_ms, strict=True)]
        cell["added_p50_ms"] = round(statistics.median(added), 3)
        cell["direct_p50_ms"] = round(statistics.median(direct_p50_ms), 3)
        cell["rounds"]["added_p50_ms"] = added
    return cell


def parse_figures(document: object, source: str) -> Figures:
    """Validate a figures document; ``source`` names it in errors (a file path)."""
    if not isinstance(document, Mapping):
        raise FiguresError(f"{source}: the document is {type(document).__name__}, not an object")
    version = document.get("format")
    if version != FORMAT:
        raise FiguresError(
            f"{source}: format: {version!r} is not {FORMAT}, the format this check reads "
            "(write a new baseline with `make bench-baseline`)"
        )
    meta = document.get("meta", {})
    if not isinstance(meta, Mapping):
        raise FiguresError(f"{source}: meta: {meta!r} is not an object")
    raw_cells = document.get("cells")
    if not isinstance(raw_cells, list) or not raw_cells:
        raise FiguresError(f"{source}: cells: {raw_cells!r} is not a non-empty list")
    cells = tuple(_cell(raw, f"{source}: cells[{index}]") for index, raw in enumerate(raw_cells))
    seen: set[str] = set()
    for index, cell in enumerate(cells):
        if cell.key in seen:
            raise FiguresError(f"{source}: cells[{index}]: {cell.key} appears twice")
        seen.add(cell.key)
    return Figures(meta=meta, cells=cells)


def judge(
    baseline: float,
    now: float,
    tolerance: float,
    floor: float = 0.0,
) -> tuple[float, Verdict]:
    """The relative change of a lower-is-better figure and its verdict.

    Worse: ``now > baseline * (1 + tolerance)`` and ``now - baseline > floor``. Better:
    ``now < baseline * (1 - tolerance)`` and ``baseline - now > floor``. Otherwise ok.
    """
    if baseline > 0:
        change = now / baseline - 1
    else:
        change = 0.0 if now == baseline else math.copysign(math.inf, now - baseline)
    allowed = max(abs(baseline) * tolerance, floor)
    # rounded: 1.5 * 1.10 - 1.5 is 0.15000000000000013 in binary, and exactly 10 % is allowed
    excess = round(abs(now - baseline) - allowed, 9)
    if excess > 0 and now > baseline:
        return change, "WORSE"
    if excess > 0 and now < baseline:
        return change, "better"
    return change, "ok"


_MEASURED_ALIKE: Final = (
    ("engine", "load generator engine", True),
    ("pinned", "pinning (taskset)", True),
    ("cpu", "CPU model", False),
    ("cores", "cores", False),
)
"""Meta fields that must match (True: else the figures are incomparable) or should match."""


def busy_problem(meta: Mapping[str, Any], max_other_work_pct: float) -> str | None:
    """Why a run cannot be trusted because other work shared its cores, or None.

    ``meta["other_work_pct"]`` maps each core the run used to the share of it (in % over the
    run) that other processes took. Above ``max_other_work_pct`` on any core, two runs of the
    same code differ by more than the tolerance: the figures say more about the neighbours
    than about the code.
    """
    other = meta.get("other_work_pct") or {}
    busy = {core: pct for core, pct in other.items() if pct > max_other_work_pct}
    if not busy:
        return None
    cores = ", ".join(f"{core} {pct:.0f} %" for core, pct in busy.items())
    return (
        f"the machine was busy: other work took {cores} during the run (more than "
        f"{max_other_work_pct:.0f} %); run it again when the machine is quiet"
    )


def compare(
    baseline: Figures,
    current: Figures,
    tolerance: float,
    p50_floor_ms: float = 0.0,
    max_other_work_pct: float = math.inf,
) -> Comparison:
    """Judge every figure of the baseline against the run."""
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance: {tolerance!r} is not in [0, 1)")
    problems: list[str] = []
    warnings: list[str] = []
    busy = busy_problem(current.meta, max_other_work_pct)
    if busy:
        problems.append(busy)
    for field, label, required in _MEASURED_ALIKE:
        then, now = baseline.meta.get(field), current.meta.get(field)
        if then != now:
            text = f"{label}: the baseline was measured with {then!r}, this run with {now!r}"
            (problems if required else warnings).append(text)
    rows: list[Row] = []
    for base in baseline.cells:
        cell = current.cell(base.key)
        if cell is None:
            problems.append(f"{base.key}: the baseline has this cell, the run did not measure it")
            continue
        if base.direct_p50_ms and cell.direct_p50_ms:
            moved = cell.direct_p50_ms / base.direct_p50_ms - 1
            if abs(moved) > tolerance:
                warnings.append(
                    f"{base.key}: the upstream alone answered in {cell.direct_p50_ms:.3f} ms "
                    f"(p50), {_change(moved)} against the baseline's {base.direct_p50_ms:.3f} "
                    "ms: the machine itself is faster or slower, and the added p50 moves with it"
                )
        for name in CHECKED:
            then, now = base.figure(name), cell.figure(name)
            if then is None:
                continue
            if now is None:
                problems.append(f"{base.key}: the run has no {LABELS[name]} for this cell")
                continue
            floor = p50_floor_ms if name == "added_p50_ms" else 0.0
            change, verdict = judge(then, now, tolerance, floor)
            rows.append(Row(base.key, name, then, now, change, verdict))
    for cell in current.cells:
        if baseline.cell(cell.key) is None:
            problems.append(
                f"{cell.key}: the run measured this cell, the baseline has no figure for it "
                "(write a new baseline with `make bench-baseline`)"
            )
    return Comparison(tuple(rows), tuple(problems), tuple(warnings))


def exit_code(comparison: Comparison) -> int:
    """2 when the comparison is broken, 1 when any figure is worse, else 0."""
    if comparison.problems or not comparison.rows:
        return EXIT_BROKEN
    if any(row.verdict == "WORSE" for row in comparison.rows):
        return EXIT_REGRESSION
    return EXIT_PASS


def percent(fraction: float) -> str:
    """``0.1`` → ``10 %`` (the house's spelling)."""
    return f"{fraction * 100:g} %"


def _value(name: str, value: float) -> str:
    return f"{value:.3f}" if name == "added_p50_ms" else f"{value:.3f}x"


def _change(change: float) -> str:
    return f"{change:+.1%}" if math.isfinite(change) else ("+inf" if change > 0 else "-inf")


def render(comparison: Comparison, tolerance: float) -> str:
    """The verdict table (Markdown) and what follows from it, as printed by the check."""
    lines = [
        "| cell | figure | baseline | now | change | verdict |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for row in comparison.rows:
        lines.append(
            f"| {row.cell} | {LABELS[row.figure]} | {_value(row.figure, row.baseline)} | "
            f"{_value(row.figure, row.now)} | {_change(row.change)} | {row.verdict} |"
        )
    for warning in comparison.warnings:
        lines.append(f"\nwarning: {warning}")
    for problem in comparison.problems:
        lines.append(f"\nbroken: {problem}")
    code = exit_code(comparison)
    worse = [row for row in comparison.rows if row.verdict == "WORSE"]
    better = [row for row in comparison.rows if row.verdict == "better"]
    if code == EXIT_BROKEN:
        lines.append("\nFAIL (broken): the run cannot be compared with the baseline.")
    elif code == EXIT_REGRESSION:
        names = ", ".join(f"{row.cell} {LABELS[row.figure]}" for row in worse)
        lines.append(f"\nFAIL: more than {percent(tolerance)} worse than the baseline: {names}.")
    else:
        lines.append(f"\nPASS: every figure within {percent(tolerance)} of the baseline or better.")
        if better:
            lines.append(
                f"{len(better)} figure(s) improved by more than {percent(tolerance)}: if the "
                "change is intended, move the line with `make bench-baseline` and commit "
                "bench/baseline.json with it."
            )
    return "\n".join(lines)
