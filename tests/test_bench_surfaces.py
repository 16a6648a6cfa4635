"""The surfaces benchmark (issues 27 and 28, ``bench/bench_surfaces.py``): how its figures are
made from the rounds, and how its load generator judges an Anthropic Messages answer and an
OpenAI Responses one.

No timing here: the figures come from synthetic cells, and the load generator's verdict on one
request is checked against the fake upstream's real Messages routes. Measuring is the
benchmark's job (``make bench``).
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from iop_edge.testing.fake_behavior import BEHAVIOR_HEADER
from iop_edge.testing.fake_openai import FakeOpenAI

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import bench_surfaces  # noqa: E402  (bench/ is a folder of scripts, on the path only from here)
import loadgen  # noqa: E402
import run_all  # noqa: E402


def cell(cpu: float | None, p50: float) -> dict[str, Any]:
    return {"cpu_us_per_req": cpu, "latency_ms": {"p50": p50}}


def rounds(cpu: dict[str, list[float]], p50: dict[str, list[float]]) -> bench_surfaces.Rounds:
    """Cells of every group; a scenario's CPU and p50 per round from ``cpu`` / ``p50`` (by
    scenario, the same in every group), else 100 µs and 1 ms."""
    count = len(next(iter(cpu.values())))
    return {
        group.key: {
            name: [
                cell(cpu.get(name, [100.0] * count)[i], p50.get(name, [1.0] * count)[i])
                for i in range(count)
            ]
            for name in group.scenarios
        }
        for group in bench_surfaces.GROUPS
    }


def row(rows: list[dict[str, Any]], figure: str, cell: str | None = None) -> dict[str, Any]:
    return next(r for r in rows if r["figure"] == figure and cell in (None, r.get("cell")))


def test_each_cpu_ratio_is_the_median_of_the_rounds_pairs_not_the_ratio_of_the_medians():
    result = bench_surfaces.figures(
        rounds({"messages-translated": [120, 300, 100], "chat": [100, 200, 50]}, {})
    )
    translated = row(result["cpu"], "translated Messages / chat, streaming", "stream c=16")
    assert translated["rounds"] == [1.2, 1.5, 2.0]
    assert translated["ratio"] == 1.5  # the medians' ratio would be 120 / 100
    assert translated["cpu_us_per_req"] == [120.0, 100.0]
    assert translated["target"] == 1.3
    assert translated["met"] is False


def test_the_targets_are_1_3_translated_and_1_05_passthrough_and_the_rest_is_reported():
    result = bench_surfaces.figures(
        rounds({"messages-translated": [130.0], "messages-passthrough": [106.0]}, {})
    )
    translated = row(result["cpu"], "translated Messages / chat, streaming", "stream c=16")
    passthrough = row(
        result["cpu"], "passthrough Messages / chat on the passthrough provider, streaming"
    )
    assert (translated["ratio"], translated["met"]) == (1.3, True)  # at the target: met
    assert (passthrough["ratio"], passthrough["target"], passthrough["met"]) == (1.06, 1.05, False)
    assert passthrough["scenarios"] == ["messages-passthrough", "chat-native"]
    unjudged = [r["figure"] + " " + r["cell"] for r in result["cpu"] if r["target"] is None]
    assert unjudged == [
        "control: chat on the passthrough provider / chat stream c=16",
        "the store: translated Responses, store: true / store: false, streaming stream c=16",
        "translated Messages / chat, non-streaming plain c=16",
        "translated Responses / chat, non-streaming plain c=16",
        "translated Messages / chat, streaming stream c=1",
        "passthrough Messages / chat, streaming stream c=1",
        "translated Responses / chat, streaming stream c=1",
        "passthrough Responses / chat, streaming stream c=1",
    ]
    assert not bench_surfaces.all_met(result)


def test_responses_are_judged_as_messages_are_with_and_without_the_store():
    cpu = {
        "chat": [100.0, 100.0],
        "chat-native": [100.0, 110.0],
        "responses-translated": [120.0, 125.0],
        "responses-translated-stored": [135.0, 140.0],
        "responses-passthrough": [104.0, 115.0],
    }
    result = bench_surfaces.figures(rounds(cpu, {}))
    translated = row(result["cpu"], "translated Responses, store: false / chat, streaming")
    stored = row(result["cpu"], "translated Responses, store: true / chat, streaming")
    passthrough = row(
        result["cpu"], "passthrough Responses / chat on the passthrough provider, streaming"
    )
    store = row(
        result["cpu"], "the store: translated Responses, store: true / store: false, streaming"
    )
    assert (translated["ratio"], translated["target"], translated["met"]) == (1.225, 1.3, True)
    assert (stored["ratio"], stored["met"]) == (1.375, False)
    assert stored["scenarios"] == ["responses-translated-stored", "chat"]
    # against chat on its own provider, per round: 1.04 and 1.0455
    assert (passthrough["rounds"], passthrough["met"]) == ([1.04, 1.0455], True)
    assert store["rounds"] == [1.125, 1.12]
    assert store["target"] is None
    assert not bench_surfaces.all_met(result)  # the stored stream missed its target


def test_only_the_surfaces_asked_for_are_measured_and_reported():
    messages = bench_surfaces.groups(["messages"])
    names = {name for group in messages for name in group.scenarios}
    assert "responses-translated" not in names
    assert {"chat", "chat-native", "direct-chat", "messages-passthrough"} <= names
    responses = bench_surfaces.groups(["responses"])
    assert [group.scenarios for group in responses] == [
        (
            "chat",
            "responses-translated",
            "responses-translated-stored",
            "responses-passthrough",
            "chat-native",
        ),
        (
            "direct-chat",
            "direct-responses",
            "chat",
            "responses-translated",
            "responses-passthrough",
        ),
        ("chat", "responses-translated"),
    ]
    count = 2
    measured = {
        group.key: {name: [cell(100.0, 1.0)] * count for name in group.scenarios}
        for group in responses
    }
    result = bench_surfaces.figures(measured)
    assert result["surfaces"] == ["responses"]
    assert not [r for r in result["cpu"] if "Messages" in r["figure"]]
    assert [r["figure"] for r in result["added_p50"]] == [
        "chat",
        "responses, translated",
        "responses, passthrough",
    ]
    text = bench_surfaces.markdown(result)
    assert text.startswith("#### OpenAI Responses against chat on the same provider")
    both = bench_surfaces.markdown(bench_surfaces.figures(rounds({"chat": [1.0]}, {})))
    assert both.startswith("#### Anthropic Messages and OpenAI Responses against chat")


def test_the_api_option_names_the_surfaces_in_any_order_and_refuses_others(capsys):
    assert bench_surfaces.parse_options([]).api == ["messages", "responses"]
    assert bench_surfaces.parse_options(["--api", "responses,messages"]).api == [
        "messages",
        "responses",
    ]
    assert bench_surfaces.parse_options(["--api", "responses"]).api == ["responses"]
    with pytest.raises(SystemExit) as exited:
        bench_surfaces.parse_options(["--api", "responses,chat"])
    assert exited.value.code == 2
    assert "'responses,chat' is not a list of surfaces" in capsys.readouterr().err


def test_the_added_p50_subtracts_the_upstream_doing_the_same_work_and_is_judged_against_chats():
    p50 = {
        "direct-chat": [0.20, 0.30],
        "direct-messages": [0.40, 0.40],
        "chat": [0.70, 0.80],  # added 0.50 in both rounds
        "messages-translated": [0.76, 0.88],  # added 0.56, 0.58: +14 %, over 0.01 ms
        "messages-passthrough": [0.95, 0.90],  # against the fake's Messages: 0.55, 0.50
        "direct-responses": [0.30, 0.35],
        "responses-translated": [0.70, 0.85],  # added 0.50, 0.55: +5 %, unchanged
        "responses-passthrough": [0.95, 0.95],  # against the fake's Responses: 0.65, 0.60
    }
    result = bench_surfaces.figures(rounds({"chat": [100.0, 100.0]}, p50))
    chat = row(result["added_p50"], "chat")
    translated = row(result["added_p50"], "messages, translated")
    passthrough = row(result["added_p50"], "messages, passthrough")
    assert chat["added_p50_ms"] == 0.5
    assert "met" not in chat
    assert translated["rounds"] == [0.56, 0.58]
    assert (translated["against_chat_ms"], translated["met"]) == (0.07, False)
    assert (passthrough["added_p50_ms"], passthrough["met"]) == (0.525, True)  # +5 %: unchanged
    assert passthrough["scenarios"] == ["messages-passthrough", "direct-messages"]
    responses = row(result["added_p50"], "responses, translated")
    responses_passthrough = row(result["added_p50"], "responses, passthrough")
    assert (responses["added_p50_ms"], responses["met"]) == (0.525, True)
    assert responses_passthrough["rounds"] == [0.65, 0.6]
    assert (responses_passthrough["against_chat_ms"], responses_passthrough["met"]) == (
        0.125,
        False,
    )
    assert responses_passthrough["scenarios"] == ["responses-passthrough", "direct-responses"]


def test_the_added_p50_is_judged_against_chats_of_the_same_round():
    # The third round ran on a slower machine for both: against chat's of the same round the
    # translated stream adds 0.02 ms each time, where the two medians are 0.2 ms apart.
    p50 = {
        "direct-chat": [0.2, 0.2, 0.2],
        "chat": [0.6, 0.6, 1.0],
        "messages-translated": [0.62, 0.82, 0.82],
    }
    result = bench_surfaces.figures(rounds({"chat": [100.0] * 3}, p50))
    translated = row(result["added_p50"], "messages, translated")
    assert translated["against_chat_rounds"] == [0.02, 0.22, -0.18]
    assert translated["against_chat_ms"] == 0.02
    assert translated["met"] is True  # +5 % of chat's 0.4 ms


def test_a_tiny_added_p50_is_unchanged_within_the_floor_of_a_hundredth_of_a_millisecond():
    p50 = {"direct-chat": [0.100], "chat": [0.120], "messages-translated": [0.129]}
    result = bench_surfaces.figures(rounds({"chat": [100.0]}, p50))
    assert row(result["added_p50"], "messages, translated")["met"] is True  # +45 %, +0.009 ms


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 7, 8])
def test_over_the_rounds_every_scenario_takes_every_position_and_follows_every_other_alike(count):
    names = [f"s{i}" for i in range(count)]
    cycle = 2 * count if count % 2 else count
    orders = [bench_surfaces.round_order(names, i) for i in range(cycle)]
    assert all(sorted(order) == names for order in orders)
    for position in range(count):
        column = [order[position] for order in orders]
        assert all(column.count(name) == cycle // count for name in names)
    follows: dict[tuple[str, str], int] = {}
    for order in orders:
        for before, after in itertools.pairwise(order):
            follows[before, after] = follows.get((before, after), 0) + 1
    if count > 1:
        # every ordered pair of different scenarios, equally often
        assert len(follows) == count * (count - 1)
        assert len(set(follows.values())) == 1
    assert bench_surfaces.round_order(names, cycle) == orders[0]


def test_the_groups_orders_put_each_scenario_after_different_ones():
    group = bench_surfaces.GROUPS[0]  # streaming at concurrency 16, seven scenarios
    before_stored = {
        order[order.index("responses-translated-stored") - 1]
        for order in (bench_surfaces.round_order(group.scenarios, i) for i in range(7))
        if order[0] != "responses-translated-stored"
    }
    # three, each twice (all six over 14 rounds); turning by one: always responses-translated
    assert len(before_stored) == 3


def test_the_table_names_each_verdict():
    result = bench_surfaces.figures(
        rounds({"messages-translated": [200.0]}, {"messages-passthrough": [1.0]})
    )
    text = bench_surfaces.markdown(result)
    assert (
        "| translated Messages / chat, streaming | stream c=16 | 200 / 100 | 2.000x (2.00) |"
        in (text)
    )
    assert "≤ 1.30x **missed**" in text
    assert "≤ 1.05x met" in text


def test_make_bench_runs_the_surfaces_benchmark_and_repeats_its_table(tmp_path, monkeypatch):
    assert "bench_surfaces.py" in [path.name for path in run_all.scripts()]
    monkeypatch.setattr(run_all, "RESULTS", tmp_path)
    (tmp_path / "surfaces-new.json").write_text('{"headline_markdown": "| m |"}')
    assert run_all.newest_headline("surfaces-*.json", since=0) == (
        f"| m |\n\n(from {tmp_path / 'surfaces-new.json'})"
    )
    assert run_all.proxy_headline(since=0) is None  # a surfaces result is not the proxy's


# -- the load generator's verdict on one Messages request ------------------------------------


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI(models=("bench-model",)) as server:
        yield server


async def send(fake: FakeOpenAI, argv: list[str], behavior: str = "") -> str | None:
    """One request as ``loadgen.py ARGV`` would send it; the error kind (None: a success)."""
    options = loadgen.build_parser().parse_args(
        ["--base-url", fake.base_url, "--model", "bench-model", *argv]
    )
    url, body, headers = loadgen.request_parts(options, loadgen.PROMPT)
    if behavior:
        headers[BEHAVIOR_HEADER] = behavior
    async with aiohttp.ClientSession() as session:
        kind, _, _ = await loadgen.one_request(
            session, url, body, headers, options.stream, loadgen.APIS[options.api]
        )
    return kind


@pytest.mark.parametrize("stream", [False, True])
async def test_a_complete_messages_answer_is_a_success(fake, stream):
    argv = ["--api", "messages", "--token", "secret", *(["--stream"] if stream else [])]
    assert await send(fake, argv, "chunks=16") is None
    request = fake.requests[-1]
    assert request.path == "/v1/messages"
    assert request.headers["x-api-key"] == "secret"  # what ANTHROPIC_API_KEY sends
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert "Authorization" not in request.headers
    assert request.json["max_tokens"] == 64


async def test_a_messages_stream_with_an_error_event_is_an_error(fake):
    kind = await send(fake, ["--api", "messages", "--stream"], "fault=error&fault_after=3")
    assert kind == "stream_error_event"


async def test_a_messages_stream_cut_before_message_stop_is_truncated(fake):
    kind = await send(fake, ["--api", "messages", "--stream"], "fault=malformed&fault_after=3")
    assert kind == "stream_truncated"  # the fake ends the body after its malformed frame


async def test_a_messages_answer_is_not_a_chat_answer(fake):
    options = loadgen.build_parser().parse_args(
        ["--base-url", fake.base_url, "--model", "bench-model", "--api", "messages"]
    )
    url, body, headers = loadgen.request_parts(options, loadgen.PROMPT)
    async with aiohttp.ClientSession() as session:
        kind, _, _ = await loadgen.one_request(
            session, url, body, headers, False, loadgen.APIS["chat"]
        )
    assert kind == "bad_body"  # a Message has no choices


# -- the load generator's verdict on one Responses request -----------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("store", [False, True])
async def test_a_completed_response_is_a_success(fake, stream, store):
    argv = ["--api", "responses", "--token", "secret"]
    argv += [*(["--stream"] if stream else []), *(["--store"] if store else [])]
    assert await send(fake, argv, "chunks=16") is None
    request = fake.requests[-1]
    assert request.path == "/v1/responses"
    assert request.headers["Authorization"] == "Bearer secret"
    assert request.json["input"] == loadgen.PROMPT
    assert request.json["max_output_tokens"] == 64
    assert request.json["store"] is store
    assert request.json.get("stream", False) is stream


async def test_a_responses_stream_ending_in_response_failed_is_an_error(fake):
    kind = await send(fake, ["--api", "responses", "--stream"], "fault=error&fault_after=5")
    assert kind == "stream_error_event"


async def test_a_responses_stream_cut_before_response_completed_is_not_completed(fake):
    # the fake ends the body after a malformed (but whole) output_text.delta frame
    kind = await send(fake, ["--api", "responses", "--stream"], "fault=malformed&fault_after=5")
    assert kind == "stream_not_completed"


@pytest.mark.parametrize(
    ("stream", "expected"), [(True, "stream_not_completed"), (False, "bad_body")]
)
async def test_an_incomplete_response_is_not_a_success(fake, stream, expected):
    # 16 chunks asked, 4 allowed: the fake ends with response.incomplete (max_output_tokens)
    argv = ["--api", "responses", "--max-tokens", "4", *(["--stream"] if stream else [])]
    assert await send(fake, argv, "chunks=16") == expected


def test_the_last_event_is_read_whatever_the_chunks_boundaries():
    stream = (
        b'event: response.created\ndata: {"a":"event: response.completed"}\n\n'
        b"event: response.output_text.delta\ndata: {}\n\n"
        b'event: response.completed\ndata: {"b":1}\n\n'
    )
    for size in range(1, len(stream) + 1):
        last = loadgen.LastEvent()
        for at in range(0, len(stream), size):
            last.feed(stream[at : at + size])
        assert last.name == b"response.completed", size
    last = loadgen.LastEvent()
    for at in range(0, 60):  # up to the first event's data (which names another event)
        last.feed(stream[at : at + 1])
    assert last.name == b"response.created"


@pytest.mark.parametrize("api", ["messages", "responses"])
def test_wrk_refuses_what_it_would_judge_by_chats_rules(capsys, api):
    argv = ["--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--api", api]
    assert loadgen.main([*argv, "--engine", "wrk"]) == 2
    assert "chat only" in capsys.readouterr().err


def test_store_is_refused_outside_responses(capsys):
    argv = ["--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--api", "chat", "--store"]
    assert loadgen.main(argv) == 2
    assert "--store is a field of --api responses" in capsys.readouterr().err
