"""``make bench-check``'s verdicts (issue 16): the arithmetic that turns the committed figures
and a run's figures into pass / regression / broken, and the exit status the command returns.

No timing here: every figure is synthetic, and ``bench/check.py --compare FILE`` judges a saved
run without measuring anything. The measurement itself is ``make bench-check``'s job.
"""

from __future__ import annotations

import copy
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import check  # noqa: E402  (bench/ is a folder of scripts, on the path only from here)
import proxy_bench  # noqa: E402
import regression  # noqa: E402
import run_all  # noqa: E402

META = {"engine": "python", "pinned": True, "cpu": "Test CPU", "cores": 2, "git_rev": "abc"}


def document(
    ratios: dict[str, float] | None = None,
    added: dict[str, float] | None = None,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A figures document with the six cells; ``ratios``/``added`` override by cell key."""
    ratios = ratios or {}
    added = added or {}
    cells = []
    for mode in ("plain", "stream"):
        for concurrency in (1, 16, 64):
            key = f"{mode} c={concurrency}"
            ratio = ratios.get(key, 1.5 if mode == "plain" else 2.0)
            cells.append(
                {
                    "mode": mode,
                    "concurrency": concurrency,
                    "cpu_ratio": ratio,
                    "edge_cpu_us_per_req": 150.0 * ratio,
                    "passthrough_cpu_us_per_req": 150.0,
                    "added_p50_ms": added.get(key, 0.3) if concurrency == 1 else None,
                    "rounds": {"cpu_ratio": [ratio]},
                }
            )
    return {"format": 1, "meta": {**META, **(meta or {})}, "cells": cells}


def figures(doc: dict[str, Any]) -> regression.Figures:
    return regression.parse_figures(doc, "test")


def verdicts(comparison: regression.Comparison) -> dict[tuple[str, str], str]:
    return {(row.cell, row.figure): row.verdict for row in comparison.rows}


# -- the arithmetic ----------------------------------------------------------------------------


def test_a_figure_exactly_at_the_tolerance_passes_and_just_beyond_it_fails():
    change, verdict = regression.judge(1.5, 1.5 * 1.10, 0.10)
    assert change == pytest.approx(0.10)
    assert verdict == "ok"
    change, verdict = regression.judge(1.5, 1.5 * 1.10 + 0.001, 0.10)
    assert verdict == "WORSE"
    assert change == pytest.approx(0.1 + 0.001 / 1.5)


def test_a_figure_better_by_more_than_the_tolerance_is_called_better_not_worse():
    change, verdict = regression.judge(2.0, 1.7, 0.10)
    assert change == pytest.approx(-0.15)
    assert verdict == "better"
    change, verdict = regression.judge(2.0, 1.85, 0.10)
    assert change == pytest.approx(-0.075)
    assert verdict == "ok"


def test_the_p50_floor_keeps_a_tiny_added_p50_from_failing_on_microseconds():
    # 0.05 ms -> 0.058 ms is +16 %, but 8 µs: under a 0.01 ms floor it is noise
    assert regression.judge(0.05, 0.058, 0.10, floor=0.01)[1] == "ok"
    assert regression.judge(0.05, 0.065, 0.10, floor=0.01)[1] == "WORSE"
    # with the baseline at 0.3 ms the 10 % (0.03 ms) is larger than the floor and decides
    assert regression.judge(0.3, 0.335, 0.10, floor=0.01)[1] == "WORSE"


def test_a_zero_baseline_has_an_infinite_change_and_only_the_floor_decides():
    assert regression.judge(0.0, 0.005, 0.10, floor=0.01) == (math.inf, "ok")
    assert regression.judge(0.0, 0.02, 0.10, floor=0.01) == (math.inf, "WORSE")
    assert regression.judge(0.0, 0.0, 0.10) == (0.0, "ok")


def test_the_ratio_is_the_median_of_the_pairs_ratios_not_the_ratio_of_the_medians():
    # round 2 ran while the machine was slow for both: its pair ratio is still 1.5
    cell = regression.cell_from_rounds(
        "plain", 16, [150.0, 300.0, 165.0], [100.0, 200.0, 100.0], None, None
    )
    assert cell["cpu_ratio"] == 1.5  # pairs: 1.5, 1.5, 1.65
    assert cell["edge_cpu_us_per_req"] == 165.0
    assert cell["passthrough_cpu_us_per_req"] == 100.0
    assert cell["added_p50_ms"] is None
    assert cell["rounds"]["cpu_ratio"] == [1.5, 1.5, 1.65]


def test_the_added_p50_is_the_median_of_each_rounds_difference():
    cell = regression.cell_from_rounds(
        "stream", 1, [300.0, 310.0], [200.0, 200.0], [0.9, 1.5, 0.95], [0.6, 1.1, 0.7]
    )
    assert cell["added_p50_ms"] == 0.3  # differences 0.3, 0.4, 0.25
    assert cell["direct_p50_ms"] == 0.7
    assert cell["rounds"]["added_p50_ms"] == [0.3, 0.4, 0.25]


def test_rounds_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="same, non-zero length"):
        regression.cell_from_rounds("plain", 1, [1.0, 2.0], [1.0], None, None)
    with pytest.raises(ValueError, match="same, non-zero length"):
        regression.cell_from_rounds("plain", 1, [1.0], [1.0], [0.5], [])


# -- the comparison ----------------------------------------------------------------------------


def test_the_same_figures_pass_with_every_checked_figure_judged():
    comparison = regression.compare(figures(document()), figures(document()), 0.10)
    assert regression.exit_code(comparison) == regression.EXIT_PASS
    judged = verdicts(comparison)
    assert set(judged) == {
        *((f"{m} c={c}", "cpu_ratio") for m in ("plain", "stream") for c in (1, 16, 64)),
        ("plain c=1", "added_p50_ms"),
        ("stream c=1", "added_p50_ms"),
    }
    assert set(judged.values()) == {"ok"}
    assert "PASS: every figure within 10 %" in regression.render(comparison, 0.10)


def test_one_ratio_more_than_ten_percent_worse_fails_and_names_the_cell():
    current = figures(document(ratios={"stream c=16": 2.0 * 1.12}))
    comparison = regression.compare(figures(document()), current, 0.10)
    assert regression.exit_code(comparison) == regression.EXIT_REGRESSION
    assert verdicts(comparison)[("stream c=16", "cpu_ratio")] == "WORSE"
    text = regression.render(comparison, 0.10)
    assert "| stream c=16 | CPU/req ratio | 2.000x | 2.240x | +12.0% | WORSE |" in text
    assert "FAIL: more than 10 % worse than the baseline: stream c=16 CPU/req ratio." in text


def test_an_added_p50_more_than_ten_percent_worse_fails():
    current = figures(document(added={"plain c=1": 0.34}))
    comparison = regression.compare(figures(document()), current, 0.10, p50_floor_ms=0.01)
    assert regression.exit_code(comparison) == regression.EXIT_REGRESSION
    assert "| plain c=1 | added p50 ms | 0.300 | 0.340 | +13.3% | WORSE |" in regression.render(
        comparison, 0.10
    )


def test_a_wider_tolerance_lets_the_same_change_pass():
    current = figures(document(ratios={"plain c=64": 1.5 * 1.12}))
    assert regression.exit_code(regression.compare(figures(document()), current, 0.15)) == 0


def test_a_clear_improvement_passes_and_suggests_moving_the_line():
    current = figures(document(ratios={"plain c=1": 1.2}))
    comparison = regression.compare(figures(document()), current, 0.10)
    assert regression.exit_code(comparison) == regression.EXIT_PASS
    assert verdicts(comparison)[("plain c=1", "cpu_ratio")] == "better"
    assert "make bench-baseline" in regression.render(comparison, 0.10)


def test_a_cell_the_run_did_not_measure_is_a_broken_check_not_a_pass():
    doc = document()
    doc["cells"] = [c for c in doc["cells"] if (c["mode"], c["concurrency"]) != ("stream", 64)]
    comparison = regression.compare(figures(document()), figures(doc), 0.10)
    assert regression.exit_code(comparison) == regression.EXIT_BROKEN
    assert comparison.problems == (
        "stream c=64: the baseline has this cell, the run did not measure it",
    )
    assert "FAIL (broken)" in regression.render(comparison, 0.10)


def test_a_cell_the_baseline_lacks_is_a_broken_check():
    baseline = document()
    baseline["cells"] = baseline["cells"][:5]
    comparison = regression.compare(figures(baseline), figures(document()), 0.10)
    assert regression.exit_code(comparison) == regression.EXIT_BROKEN
    assert "the baseline has no figure for it" in comparison.problems[0]


def test_a_run_without_the_added_p50_the_baseline_has_is_broken():
    doc = document()
    doc["cells"][0]["added_p50_ms"] = None
    comparison = regression.compare(figures(document()), figures(doc), 0.10)
    assert comparison.problems == ("plain c=1: the run has no added p50 ms for this cell",)


def test_a_regression_in_a_broken_run_is_still_reported_as_broken():
    current = figures(document(ratios={"plain c=1": 3.0}, meta={"engine": "wrk"}))
    comparison = regression.compare(figures(document()), current, 0.10)
    assert regression.exit_code(comparison) == regression.EXIT_BROKEN


def test_another_load_generator_or_pinning_makes_the_figures_incomparable():
    for field, value in (("engine", "wrk"), ("pinned", False)):
        current = figures(document(meta={field: value}))
        comparison = regression.compare(figures(document()), current, 0.10)
        assert regression.exit_code(comparison) == regression.EXIT_BROKEN, field
        assert "the baseline was measured with" in comparison.problems[0]


def test_another_cpu_model_is_a_warning_only():
    current = figures(document(meta={"cpu": "Other CPU"}))
    comparison = regression.compare(figures(document()), current, 0.10)
    assert regression.exit_code(comparison) == regression.EXIT_PASS
    assert comparison.warnings == (
        "CPU model: the baseline was measured with 'Test CPU', this run with 'Other CPU'",
    )


def test_a_slower_upstream_is_named_in_a_warning_beside_the_added_p50():
    baseline, current = document(), document(added={"plain c=1": 0.35})
    baseline["cells"][0]["direct_p50_ms"] = 0.200
    current["cells"][0]["direct_p50_ms"] = 0.230
    comparison = regression.compare(figures(baseline), figures(current), 0.10)
    assert regression.exit_code(comparison) == regression.EXIT_REGRESSION  # still judged
    assert comparison.warnings == (
        "plain c=1: the upstream alone answered in 0.230 ms (p50), +15.0% against the "
        "baseline's 0.200 ms: the machine itself is faster or slower, and the added p50 moves "
        "with it",
    )
    current["cells"][0]["direct_p50_ms"] = 0.215  # +7.5 %: within the tolerance, no warning
    assert regression.compare(figures(baseline), figures(current), 0.10).warnings == ()


def test_a_run_on_a_busy_machine_is_broken_whatever_its_figures():
    busy = {"other_work_pct": {"core 1 (targets)": 40.0, "core 0 (upstream, load)": 5.0}}
    comparison = regression.compare(
        figures(document()), figures(document(meta=busy)), 0.10, max_other_work_pct=25
    )
    assert regression.exit_code(comparison) == regression.EXIT_BROKEN
    assert comparison.problems == (
        "the machine was busy: other work took core 1 (targets) 40 % during the run (more "
        "than 25 %); run it again when the machine is quiet",
    )
    quiet = {"other_work_pct": {"core 1 (targets)": 4.0, "core 0 (upstream, load)": 9.0}}
    comparison = regression.compare(
        figures(document()), figures(document(meta=quiet)), 0.10, max_other_work_pct=25
    )
    assert regression.exit_code(comparison) == regression.EXIT_PASS


def test_a_tolerance_outside_zero_to_one_is_refused():
    with pytest.raises(ValueError, match=r"tolerance: 1.5 is not in \[0, 1\)"):
        regression.compare(figures(document()), figures(document()), 1.5)


# -- parsing -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(format=2), "base.json: format: 2 is not 1"),
        (lambda d: d.pop("cells"), "base.json: cells: None is not a non-empty list"),
        (
            lambda d: d["cells"][2].update(cpu_ratio="fast"),
            "base.json: cells[2].cpu_ratio: 'fast' is not a finite number",
        ),
        (
            lambda d: d["cells"][1].update(passthrough_cpu_us_per_req=0),
            "base.json: cells[1].passthrough_cpu_us_per_req: 0 is not positive",
        ),
        (
            lambda d: d["cells"][0].update(mode="sse"),
            "base.json: cells[0].mode: 'sse' is not one of plain, stream",
        ),
        (
            lambda d: d["cells"][0].update(concurrency=0),
            "base.json: cells[0].concurrency: 0 is not an integer >= 1",
        ),
        (
            lambda d: d["cells"][0].update(added_p50_ms=float("nan")),
            "base.json: cells[0].added_p50_ms: nan is not a finite number",
        ),
        (
            lambda d: d["cells"].append(copy.deepcopy(d["cells"][0])),
            "base.json: cells[6]: plain c=1 appears twice",
        ),
    ],
)
def test_a_bad_figures_document_names_the_field_the_value_and_the_rule(change, message):
    doc = document()
    change(doc)
    with pytest.raises(regression.FiguresError) as caught:
        regression.parse_figures(doc, "base.json")
    assert str(caught.value).startswith(message)


# -- the command's exit status -----------------------------------------------------------------


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc))
    return path


def run_check(
    tmp_path: Path, baseline: dict[str, Any] | None, run: dict[str, Any], *extra: str
) -> int:
    argv = ["--compare", str(write(tmp_path / "run.json", run))]
    base = tmp_path / "baseline.json"
    if baseline is not None:
        write(base, baseline)
    return check.main([*argv, "--baseline", str(base), *extra])


def test_the_command_exits_0_when_every_figure_holds(tmp_path, capsys):
    assert run_check(tmp_path, document(), document(ratios={"plain c=16": 1.6})) == 0
    out = capsys.readouterr().out
    assert "| plain c=16 | CPU/req ratio | 1.500x | 1.600x | +6.7% | ok |" in out
    assert "tolerance 10 %" in out


def test_the_command_exits_1_on_a_regression_and_prints_the_table(tmp_path, capsys):
    code = run_check(tmp_path, document(), document(ratios={"stream c=1": 2.3}))
    assert code == 1
    out = capsys.readouterr().out
    assert "| cell | figure | baseline | now | change | verdict |" in out
    assert "| stream c=1 | CPU/req ratio | 2.000x | 2.300x | +15.0% | WORSE |" in out


def test_the_tolerance_option_changes_the_verdict(tmp_path):
    run = document(ratios={"stream c=1": 2.3})
    assert run_check(tmp_path, document(), run, "--tolerance", "0.2") == 0


def test_the_command_exits_2_without_a_baseline(tmp_path, capsys):
    assert run_check(tmp_path, None, document()) == 2
    err = capsys.readouterr().err
    assert "baseline.json: no such baseline file (write one with `make bench-baseline`)" in err


def test_the_command_exits_2_on_a_baseline_that_is_not_json(tmp_path, capsys):
    (tmp_path / "baseline.json").write_text("{not json")
    argv = ["--compare", str(write(tmp_path / "run.json", document()))]
    assert check.main([*argv, "--baseline", str(tmp_path / "baseline.json")]) == 2
    assert "the baseline cannot be read as JSON" in capsys.readouterr().err


def test_the_command_exits_2_on_a_busy_run_even_with_good_figures(tmp_path, capsys):
    busy = document(meta={"other_work_pct": {"core 1 (targets)": 60.0}})
    assert run_check(tmp_path, document(), busy) == 2
    assert "broken: the machine was busy" in capsys.readouterr().out
    assert run_check(tmp_path, document(), busy, "--max-other-work", "70") == 0


def test_the_baseline_is_measured_with_twice_the_rounds_of_a_check():
    assert check.parse_options([]).rounds == 9
    assert check.parse_options(["--update"]).rounds == 18
    assert check.parse_options(["--update", "--rounds", "5"]).rounds == 5
    assert check.parse_options([]).tolerance == 0.10


@pytest.mark.parametrize(
    "argv",
    [
        ["--tolerance", "1.5"],
        ["--tolerance", "-0.1"],
        ["--rounds", "0"],
        ["--update", "--compare", "x.json"],
        ["--p50-floor-ms", "-1"],
    ],
)
def test_bad_options_exit_2_before_anything_runs(argv, capsys):
    with pytest.raises(SystemExit) as caught:
        check.main(argv)
    assert caught.value.code == 2
    assert "error:" in capsys.readouterr().err


# -- make bench: the headline, and what it runs ------------------------------------------------


def test_make_bench_runs_the_proxy_benchmark_first_and_not_the_check():
    names = [path.name for path in run_all.scripts()]
    assert names[0] == "bench_proxy.py"
    assert "check.py" not in names
    assert names[1:] == sorted(names[1:])


def test_make_bench_repeats_the_headline_of_the_proxy_run_it_made(tmp_path, monkeypatch):
    monkeypatch.setattr(run_all, "RESULTS", tmp_path)
    old = tmp_path / "proxy-old.json"
    old.write_text(json.dumps({"headline_markdown": "old table"}))
    os.utime(old, (1_000, 1_000))
    assert run_all.proxy_headline(since=2_000) is None  # only a result of this run counts
    new = tmp_path / "proxy-new.json"
    new.write_text(json.dumps({"headline_markdown": "| the | table |"}))
    assert run_all.proxy_headline(since=2_000) == f"| the | table |\n\n(from {new})"


def test_the_headline_is_cpu_per_request_against_the_pass_through_with_the_added_p50():
    scenarios = [
        {
            "stream": stream,
            "concurrency": 16,
            "rows": [
                {"target": "direct", "cpu_us_per_req": None, "added_p50_ms": None},
                {"target": "iop-edge", "cpu_us_per_req": 300.0, "added_p50_ms": 1.2},
                {"target": "passthrough", "cpu_us_per_req": 200.0, "added_p50_ms": 0.4},
            ],
            "edge_cpu_over_ceiling_cpu": 1.5,
        }
        for stream in (False, True)
    ]
    rows = proxy_bench.headline(scenarios)
    assert [row["cpu_ratio_max"] for row in rows] == [1.2, 1.3]
    text = proxy_bench.headline_markdown(rows)
    assert text.splitlines()[3:] == [
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        "| non-streaming c=16 | 300 | 200 | 1.50x | ≤ 1.20x | 1.200 |",
        "| streaming c=16 | 300 | 200 | 1.50x | ≤ 1.30x | 1.200 |",
    ]
