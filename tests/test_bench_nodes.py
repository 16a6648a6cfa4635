"""The remote nodes benchmark (issue 29, Performance; ``bench/bench_nodes.py``): how its figures
are made from the rounds, what the load generator sends for a long stream, and a ``--quick`` run
of the real thing (an edge, an ``iop-node`` and the fake upstream as subprocesses) whose output
has every figure.

The quick run checks the shape of what the benchmark reports, not its values: timings don't
belong in tests (``make bench`` measures them).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp

from iop_edge.testing.fake_openai import FakeOpenAI

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))

import loadgen  # noqa: E402  (bench/ is a folder of scripts, on the path only from here)
import nodes_figures  # noqa: E402
import run_all  # noqa: E402


def cell(p50: float, cpu: float, node_cpu: float = 0.0, rps: float = 10.0) -> dict[str, Any]:
    return {
        "latency_ms": {"p50": p50},
        "cpu_us_per_req": cpu,
        "node_cpu_us_per_req": node_cpu,
        "finished_rps": rps,
        "events_per_request": 503,
        "core_pct": 90.0,
        "node_core_pct": node_cpu / 10,
        "upstream_core_pct": 70.0,
        "client_core_pct": 30.0,
    }


def rounds(local: list[dict[str, Any]], remote: list[dict[str, Any]]) -> nodes_figures.Rounds:
    """Every cell with the same local and remote cells in each round."""
    return {spec.key: {"local": local, "remote": remote} for spec in nodes_figures.CELLS}


def target(result: dict[str, Any], cell_key: str) -> dict[str, Any]:
    return next(row for row in result["targets"] if row["cell"] == cell_key)


def test_the_added_p50_is_the_median_of_each_rounds_difference_and_at_most_one_ms():
    """Issue 29, Performance: a request through a remote node adds at most 1 ms p50 over the
    same provider local; judged per round (the remote p50 minus the local one, seconds
    apart), the median over the rounds."""
    local = [cell(1.0, 100), cell(3.0, 100), cell(1.0, 100)]
    remote = [cell(1.5, 100), cell(3.2, 100), cell(2.2, 100)]
    result = nodes_figures.figures(rounds(local, remote))
    plain = target(result, "plain c=1")
    assert plain["rounds"] == [0.5, 0.2, 1.2]
    assert plain["value"] == 0.5  # the medians' difference would be 2.2 - 1.0
    assert (plain["local"], plain["remote"]) == (1.0, 2.2)
    assert plain["met"] is True
    late = nodes_figures.figures(rounds([cell(1.0, 100)], [cell(2.001, 100)]))
    assert target(late, "stream c=1")["met"] is False
    assert not nodes_figures.all_met(late)


def test_the_events_ratio_is_remote_over_local_events_per_second_and_at_least_0_8():
    """Issue 29, Performance: streamed events per second through one node link at least 80 %
    of the local path's: streams ended per second times the events of one stream."""
    local = [cell(1.0, 100, rps=10.0), cell(1.0, 100, rps=20.0)]
    remote = [cell(1.0, 100, rps=8.0), cell(1.0, 100, rps=14.0)]
    row = target(nodes_figures.figures(rounds(local, remote)), "long stream c=16")
    assert row["rounds"] == [0.8, 0.7]
    assert (row["value"], row["met"]) == (0.75, False)
    assert (row["local"], row["remote"]) == (15 * 503, 11 * 503)
    met = target(nodes_figures.figures(rounds(local[:1], remote[:1])), "long stream c=16")
    assert met["met"] is True  # exactly 0.8


def test_the_cpu_of_the_edge_and_of_the_node_is_reported_per_cell_with_their_sum():
    """Issue 29, Performance: the edge's and the node's CPU per request, reported (no
    target); the remote path's whole over the local path's, per round."""
    local = [cell(1.0, 200), cell(1.0, 100)]
    remote = [cell(1.0, 150, node_cpu=150), cell(1.0, 100, node_cpu=50)]
    result = nodes_figures.figures(rounds(local, remote))
    assert [row["cell"] for row in result["cpu"]] == [s.key for s in nodes_figures.CELLS]
    row = result["cpu"][0]
    assert (row["local_edge_us"], row["remote_edge_us"], row["remote_node_us"]) == (
        150.0,
        125.0,
        100.0,
    )
    assert row["remote_total_us"] == 225.0  # the median of the rounds' sums, 300 and 150
    assert row["rounds"] == [1.5, 1.5]
    assert result["cores_busy"]["remote"] == {
        "edge": 90.0,
        "node": 10.0,
        "fake": 70.0,
        "load": 30.0,
    }


def test_the_tables_name_each_figure_and_its_verdict():
    result = nodes_figures.figures(rounds([cell(1.0, 200)], [cell(1.4, 150, node_cpu=120)]))
    text = nodes_figures.markdown(result)
    assert "| added p50, plain c=1 | 1.000 ms | 1.400 ms | +0.400 ms (+0.400) | ≤ 1.0 ms met |" in (
        text
    )
    assert "| long stream c=16 | 200 | 150 | 120 | 270 | 1.35x (1.35) |" in text
    assert "≥ 0.8x met" in text
    assert "Share of one core (%) in long stream c=16: local: edge 90, node 0" in text


def test_make_bench_runs_the_nodes_benchmark_and_repeats_its_table(tmp_path, monkeypatch):
    assert "bench_nodes.py" in [path.name for path in run_all.scripts()]
    monkeypatch.setattr(run_all, "RESULTS", tmp_path)
    (tmp_path / "nodes-new.json").write_text('{"headline_markdown": "| n |"}')
    assert run_all.newest_headline("nodes-*.json", since=0) == (
        f"| n |\n\n(from {tmp_path / 'nodes-new.json'})"
    )


async def test_a_long_stream_asks_the_fake_for_its_chunks_through_the_conversation():
    """The long streams' 500 chunks are asked for in the prompt (a ``[[fake:...]]`` directive,
    which a proxy passes on) with ``max_tokens`` letting them all through."""
    async with FakeOpenAI(models=("bench-model",)) as fake:
        options = loadgen.build_parser().parse_args(
            [
                "--base-url",
                fake.base_url,
                "--model",
                "bench-model",
                "--stream",
                "--fake-behavior",
                "chunks=500",
                "--max-tokens",
                "500",
            ]
        )
        url, body, headers = loadgen.request_parts(options, loadgen.load_prompt(options))
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=body, headers=headers) as response,
        ):
            text = await response.read()
    assert response.status == 200
    assert text.endswith(b"data: [DONE]\n\n")
    assert text.count(b"\n\n") == 503  # the role, 500 pieces, the finish, [DONE]
    assert fake.requests[-1].json["max_tokens"] == 500


def test_a_quick_run_reports_every_figure(tmp_path):
    """Issue 29, Performance: the benchmark measures an edge with a local provider and a
    remote node's (a real ``iop-node``) on the same fake upstream, and reports the added p50
    (plain and streamed), the long streams' events/s ratio and the edge's and the node's CPU
    per request, with the placement it ran with."""
    done = subprocess.run(
        [sys.executable, str(BENCH / "bench_nodes.py"), "--quick", "--output", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode in (0, 1), done.stdout + done.stderr  # (2: a broken run)
    assert "placement: " in done.stdout
    (written,) = tmp_path.glob("nodes-*.json")
    document = json.loads(written.read_text())
    meta, result = document["meta"], document["figures"]
    assert meta["rounds"] == 1
    assert meta["events_per_stream"]["500"] > 500
    assert [row["cell"] for row in result["targets"]] == [
        "plain c=1",
        "stream c=1",
        "long stream c=16",
    ]
    for row in result["targets"]:
        assert min(row["local"], row["remote"]) > 0, row
        assert isinstance(row["met"], bool)
    for row in result["cpu"]:
        assert min(row["local_edge_us"], row["remote_edge_us"], row["remote_node_us"]) > 0, row
    # the node works on the remote path only
    long_stream = document["cells"]["long stream c=16"]
    assert long_stream["remote"][0]["node_cpu_us_per_req"] > (
        10 * long_stream["local"][0]["node_cpu_us_per_req"]
    )
    assert document["headline_markdown"] in done.stdout
