"""SPEC §7 cli: a real subprocess (the fake agent, ``cat``, small scripts) in its own process
group — prompt on stdin, text / json / stream-json output, exit status with the stderr tail,
timeout and cancel killing the whole group, output caps."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from iop_edge.adapters import (
    AdapterSet,
    Executor,
    UnsupportedRequestError,
    UpstreamCall,
    UpstreamStream,
    cli_process,
)
from iop_edge.adapters.cli import render_prompt
from iop_edge.adapters.cli_process import MAX_OUTPUT_BYTES, STDERR_TAIL_BYTES
from iop_edge.config import load_config
from iop_edge.config.payload import node_payload
from iop_edge.errors import AdapterError
from iop_edge.testing.clock import FakeClock
from tests.helpers import FAKE_CLI, pass_deadline, wait_for
from tests.helpers.adapters import (
    chat,
    collect,
    content_of,
    frames_until_error,
    payloads,
    read_pid_fifo,
    reply_json,
    running,
    split_frames,
    wait_gone,
)

SetFactory = Callable[..., AdapterSet]
ROOT = Path(__file__).resolve().parents[2]

CLAUDE_STREAM = """
import json, sys
sys.stdin.read()
for line in [
    {"type": "system", "subtype": "init", "session_id": "s1"},
    {"type": "assistant", "message": {"content": [
        {"type": "text", "text": "Hello "}, {"type": "tool_use", "name": "ls", "input": {}}]}},
    {"type": "user", "message": {"content": [{"type": "tool_result", "content": "skipped"}]}},
    {"type": "assistant", "message": {"content": [{"type": "text", "text": "world"}]}},
    {"type": "result", "subtype": "success", "is_error": False, "result": "Hello world",
     "usage": {"input_tokens": 12, "output_tokens": 5}},
]:
    print(json.dumps(line), flush=True)
"""


def cli_set(
    sets: SetFactory,
    args: list[str],
    *,
    command: str | None = None,
    output_format: str = "text",
    clock: FakeClock | None = None,
    **provider: Any,
) -> Executor:
    """A cli provider running ``command`` + ``args`` (default: the fake agent + ``args``),
    its deadlines on ``clock`` (the loop's when None)."""
    full_args = args if command is not None else [*FAKE_CLI[1:], *args]
    command = command or FAKE_CLI[0]
    adapter_set = sets(
        [
            {
                "name": "shell",
                "type": "cli",
                "command": command,
                "args": full_args,
                "output_format": output_format,
            }
        ],
        [{"id": "c1", "type": "cli", "adapter": "shell", **provider}],
        clock,
    )
    return adapter_set.for_provider("c1")


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is in process group ``pgid``."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


# -- prompt and output formats ---------------------------------------------------------------


def test_prompt_rendering_lone_user_message_is_its_text() -> None:
    assert render_prompt([{"role": "user", "content": "just this"}]) == "just this\n"


def test_prompt_rendering_conversation_is_role_blocks() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "!"}],
        },
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "again"},
    ]
    assert render_prompt(messages) == (
        "system: Be brief.\n\nuser: hi !\n\nassistant: hello\n\nuser: again\n"
    )


HISTORY_WITH_REASONING: list[dict[str, Any]] = [
    {"role": "user", "content": "read the log"},
    {
        "role": "assistant",
        "content": "It failed at step 3.",
        "reasoning_content": "The log ends with an error at step 3.",
    },
    {"role": "user", "content": "and now?"},
]


def test_prompt_rendering_leaves_an_assistant_turns_reasoning_out() -> None:
    """Issue 27: reasoning is never turned into text the agent reads as the assistant's."""
    assert render_prompt(HISTORY_WITH_REASONING) == (
        "user: read the log\n\nassistant: It failed at step 3.\n\nuser: and now?\n"
    )


async def test_reasoning_in_history_never_reaches_the_agent(sets: SetFactory) -> None:
    """What the command reads (cat answers it back) has the turn's text and not its reasoning."""
    executor = cli_set(sets, [], command="cat")
    call = chat()
    call.body["messages"] = HISTORY_WITH_REASONING
    answer = reply_json(await executor.complete(call))["choices"][0]["message"]
    assert answer["content"] == render_prompt(HISTORY_WITH_REASONING)
    assert "The log ends" not in answer["content"]
    assert "reasoning_content" not in answer


async def test_shipped_config_cat_echoes_the_conversation() -> None:
    config = load_config((ROOT / "configs" / "edge.yaml").read_text())
    adapter_set = AdapterSet.from_payload(node_payload(config, "local"))
    try:
        reply = await adapter_set.for_provider("echo-cat").complete(chat("hi cat", target="echo"))
    finally:
        await adapter_set.aclose()
    body = reply_json(reply)
    assert body["choices"][0]["message"]["content"] == "hi cat\n"
    assert body["choices"][0]["finish_reason"] == "stop"
    assert reply.usage.prompt_tokens is None  # cat reports no usage


async def test_text_output_non_streaming(sets: SetFactory) -> None:
    executor = cli_set(sets, [])
    call = chat("ignored")
    call.body["messages"] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "echo me"},
    ]
    reply = await executor.complete(call)
    assert reply.status == 200
    body = reply_json(reply)
    assert body["object"] == "chat.completion"
    assert body["model"] == "fake-model"
    assert body["choices"][0]["message"]["content"] == "system: Be brief.\n\nuser: echo me"


async def test_text_output_streams_as_it_arrives(sets: SetFactory) -> None:
    # The fake writes its first chunk, then hangs: the chunk must reach us before the end.
    executor = cli_set(sets, ["--reply", "first second", "--hang-after", "1"])
    stream = await executor.open_stream(chat(stream=True))
    assert isinstance(stream, UpstreamStream)
    async with stream:  # (the role goes out with the first piece of answer, in one write)
        role, first = payloads(split_frames(await anext(stream.frames)))
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["choices"][0]["delta"] == {"content": "first "}


async def test_text_output_streaming_to_the_end(sets: SetFactory) -> None:
    executor = cli_set(sets, ["--chunks", "4"])
    call = chat(
        "streamed text answer",
        stream=True,
        stream_options={"include_usage": True},
        estimated_prompt_tokens=11,
    )
    stream = await executor.open_stream(call)
    assert isinstance(stream, UpstreamStream)
    chunks = payloads(await collect(stream))
    assert chunks[-1] == "[DONE]"
    assert content_of(chunks[:-1]) == "streamed text answer"
    assert chunks[-3]["choices"][0]["finish_reason"] == "stop"
    # The client asked for usage; a text answer reports none, so it is the edge's estimate:
    # the prompt's as the edge gave it, the answer's ceil(20 bytes / 4).
    assert chunks[-2]["choices"] == []
    assert chunks[-2]["usage"] == {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}
    assert (stream.usage.prompt_tokens, stream.usage.completion_tokens) == (11, 5)
    assert stream.usage.estimated


@pytest.mark.parametrize("field", ["result", "content"])
async def test_json_output_answer_and_usage(sets: SetFactory, field: str) -> None:
    executor = cli_set(sets, ["--format", "json", "--json-field", field], output_format="json")
    reply = await executor.complete(chat("three little words"))
    assert reply_json(reply)["choices"][0]["message"]["content"] == "three little words"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (3, 3)

    stream = await executor.open_stream(chat("three little words", stream=True))
    chunks = payloads(await collect(stream))
    assert content_of(chunks[:-1]) == "three little words"
    assert stream.usage.completion_tokens == 3


async def test_json_output_that_is_not_json_fails_with_502(sets: SetFactory) -> None:
    executor = cli_set(sets, [], output_format="json")  # the fake answers plain text
    with pytest.raises(AdapterError) as caught:
        await executor.complete(chat("not json"))
    assert caught.value.code == "upstream_error"
    assert caught.value.status == 502
    assert "not one JSON object" in str(caught.value)
    assert "provider 'c1'" in str(caught.value)


async def test_stream_json_output_fake_shape(sets: SetFactory) -> None:
    executor = cli_set(sets, ["--format", "stream-json"], output_format="stream-json")
    stream = await executor.open_stream(chat("one two three", stream=True))
    chunks = payloads(await collect(stream))
    assert [c["choices"][0]["delta"].get("content") for c in chunks[1:-2]] == [
        "one ",
        "two ",
        "three",
    ]
    assert (stream.usage.prompt_tokens, stream.usage.completion_tokens) == (3, 3)

    reply = await executor.complete(chat("one two three"))
    assert reply_json(reply)["choices"][0]["message"]["content"] == "one two three"
    assert reply_json(reply)["usage"]["total_tokens"] == 6


async def test_stream_json_output_claude_code_shape(sets: SetFactory) -> None:
    executor = cli_set(
        sets, ["-c", CLAUDE_STREAM], command=sys.executable, output_format="stream-json"
    )
    stream = await executor.open_stream(chat(stream=True))
    chunks = payloads(await collect(stream))
    assert [c["choices"][0]["delta"].get("content") for c in chunks[1:-2]] == ["Hello ", "world"]
    assert (stream.usage.prompt_tokens, stream.usage.completion_tokens) == (12, 5)

    reply = await executor.complete(chat())
    assert reply_json(reply)["choices"][0]["message"]["content"] == "Hello world"
    assert reply_json(reply)["usage"] == {
        "prompt_tokens": 12,
        "completion_tokens": 5,
        "total_tokens": 17,
    }


async def test_stream_json_malformed_line_fails_mid_stream(sets: SetFactory) -> None:
    script = 'import sys; sys.stdin.read(); print(\'{"type": "content", "content": "ok"}\');'
    script += "print('oops, not json', flush=True)"
    executor = cli_set(sets, ["-c", script], command=sys.executable, output_format="stream-json")
    with pytest.raises(AdapterError) as caught:
        await executor.complete(chat())
    assert "stdout line 2 is not JSON" in str(caught.value)


# -- failures --------------------------------------------------------------------------------


async def test_non_zero_exit_is_an_upstream_error_with_the_stderr_tail(sets: SetFactory) -> None:
    executor = cli_set(sets, [])
    call = chat("[[fake-cli: --exit-code 3 --stderr 'login required: run agent login']]")
    with pytest.raises(AdapterError) as caught:
        await executor.complete(call)
    assert caught.value.code == "upstream_error"
    assert caught.value.status == 502
    message = str(caught.value)
    assert "exited with status 3" in message
    assert "login required: run agent login" in message
    assert "cli provider 'c1'" in message

    # Streaming: the command failed before any output, so it fails before any frame too.
    with pytest.raises(AdapterError, match="exited with status 3"):
        await executor.open_stream(chat(call.body["messages"][0]["content"], stream=True))


async def test_the_stderr_tail_is_bounded(sets: SetFactory) -> None:
    script = "import sys; sys.stdin.read(); sys.stderr.write('e' * 100000 + 'LAST WORDS'); exit(1)"
    executor = cli_set(sets, ["-c", script], command=sys.executable)
    with pytest.raises(AdapterError) as caught:
        await executor.complete(chat())
    message = str(caught.value)
    assert message.endswith("LAST WORDS")
    assert "e" * (STDERR_TAIL_BYTES - 20) in message
    assert len(message) < STDERR_TAIL_BYTES + 300


async def test_a_crash_after_output_fails_from_the_frames(sets: SetFactory) -> None:
    executor = cli_set(sets, [])
    text = "partial answer [[fake-cli: --exit-code 4 --answer-then-exit --stderr crashed]]"
    stream = await executor.open_stream(chat(text, stream=True))
    assert isinstance(stream, UpstreamStream)
    received, error = await frames_until_error(stream)
    assert content_of(payloads(received)) == "partial answer"
    assert "exited with status 4" in str(error)
    assert "crashed" in str(error)
    assert b"[DONE]" not in b"".join(received)


async def test_a_command_that_cannot_start_is_an_upstream_error(sets: SetFactory) -> None:
    executor = cli_set(sets, [], command="/nonexistent/agent-cli")
    for attempt in (executor.complete(chat()), executor.open_stream(chat(stream=True))):
        with pytest.raises(AdapterError) as caught:
            await attempt
        assert caught.value.code == "upstream_error"
        assert caught.value.status == 502
        assert "'/nonexistent/agent-cli'" in str(caught.value)
        assert "could not be started" in str(caught.value)


async def test_a_flood_is_capped_and_the_group_killed(sets: SetFactory) -> None:
    executor = cli_set(sets, ["--flood", str(MAX_OUTPUT_BYTES + 100_000)])
    with pytest.raises(AdapterError) as caught:
        await executor.complete(chat())
    assert f"more than {MAX_OUTPUT_BYTES} bytes" in str(caught.value)


async def test_environment_is_minimal_plus_the_env_field(
    sets: SetFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IOP_DAEMON_SECRET", "do-not-leak")
    monkeypatch.setenv("LANG", "C.UTF-8")
    executor = cli_set(sets, [], command="/usr/bin/env", env={"AGENT_MODE": "edge"})
    reply = await executor.complete(chat(request_id="req-env-1"))
    variables = dict(
        line.split("=", 1)
        for line in reply_json(reply)["choices"][0]["message"]["content"].splitlines()
    )
    assert variables["AGENT_MODE"] == "edge"
    assert variables["LANG"] == "C.UTF-8"
    assert variables["PATH"] == os.environ["PATH"]
    assert "IOP_DAEMON_SECRET" not in variables
    # The request id reaches the command as IOP_EDGE_REQUEST_ID; nothing else is added.
    assert variables["IOP_EDGE_REQUEST_ID"] == "req-env-1"
    assert set(variables) <= {*cli_process.INHERITED_ENV, "AGENT_MODE", "IOP_EDGE_REQUEST_ID"}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", 0.2),
        ("tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}]),
        ("n", 2),
        ("response_format", {"type": "json_object"}),
        ("stop", ["END"]),
        ("x_vendor", 1),
    ],
)
async def test_a_field_a_cli_cannot_honour_is_refused_before_it_starts(
    sets: SetFactory, field: str, value: Any, tmp_path: Path
) -> None:
    """Issue 15: a request field a cli provider cannot honour is a 400 naming it, never
    silently dropped (and the command never runs)."""
    marker = tmp_path / "ran"
    executor = cli_set(sets, [str(marker)], command="/usr/bin/touch")
    with pytest.raises(UnsupportedRequestError) as caught:
        await executor.complete(chat(**{field: value}))
    assert (caught.value.status, caught.value.code) == (400, "unsupported_parameter")
    assert caught.value.param == field
    assert f"'{field}' cannot be honoured by cli provider" in str(caught.value)
    assert not marker.exists()


async def test_fields_a_cli_accepts_without_effect(sets: SetFactory) -> None:
    """Defaults, fields without effect on the answer, and the policy's token limits pass."""
    executor = cli_set(sets, [])
    call = chat(
        "fine",
        n=1,
        logprobs=False,
        user="u-1",
        metadata={"k": "v"},
        max_tokens=10,
        thinking_token_budget=100,
        reasoning_effort="high",
        temperature=None,
    )
    reply = reply_json(await executor.complete(call))
    assert reply["choices"][0]["message"]["content"] == "fine"


async def test_a_reasoning_effort_ollama_would_refuse_is_refused_by_cli_too(
    sets: SetFactory,
) -> None:
    """Every request cli honours, ollama honours too (so a mixed group's capable providers are
    one of its scheduler groups)."""
    executor = cli_set(sets, [])
    with pytest.raises(UnsupportedRequestError) as caught:
        await executor.complete(chat("x", reasoning_effort="extreme"))
    assert caught.value.param == "reasoning_effort"


async def test_completions_endpoint_is_an_invalid_request(sets: SetFactory) -> None:
    executor = cli_set(sets, [])
    call = UpstreamCall("completions", {"model": "m", "prompt": "hi"}, "t", False, {}, "r")
    with pytest.raises(UnsupportedRequestError) as caught:
        await executor.complete(call)
    assert caught.value.status == 400
    assert caught.value.code == "invalid_request_error"


# -- the process group is never left behind ---------------------------------------------------


async def test_a_hang_times_out_and_the_whole_group_is_killed(
    sets: SetFactory, tmp_path: Path
) -> None:
    pid_file = tmp_path / "child.pid"
    clock = FakeClock()
    executor = cli_set(
        sets, ["--spawn-child", "--pid-file", str(pid_file)], clock=clock, request_timeout_ms=500
    )
    # once the agent has forked its child (then it hangs)
    spawned = lambda: pid_file.exists() and pid_file.read_text().endswith("\n")  # noqa: E731
    deadline = asyncio.create_task(pass_deadline(clock, 0.5, spawned))
    with pytest.raises(AdapterError) as caught:
        await executor.complete(chat("[[fake-cli: --hang]]"))
    await deadline
    assert caught.value.code == "upstream_timeout"
    assert caught.value.status == 504
    assert "request_timeout_ms=500" in str(caught.value)
    child = int(pid_file.read_text())
    await wait_gone(child)
    assert not running(child)


async def test_a_stalled_stream_times_out_and_the_whole_group_is_killed(
    sets: SetFactory, tmp_path: Path
) -> None:
    pid_file = tmp_path / "child.pid"
    clock = FakeClock()
    executor = cli_set(
        sets,
        ["--spawn-child", "--pid-file", str(pid_file), "--hang-after", "1"],
        clock=clock,
        request_timeout_ms=500,
    )
    stream = await executor.open_stream(chat("one two", stream=True))
    child = int(pid_file.read_text())  # written before the first output we already saw
    pgid = os.getpgid(child)
    deadline = asyncio.create_task(pass_deadline(clock, 0.5))
    with pytest.raises(AdapterError) as caught:
        await collect(stream)
    await deadline
    assert caught.value.code == "upstream_timeout"
    await wait_gone(child)
    await wait_gone(pgid)
    assert not group_alive(pgid)


async def test_cancelling_the_caller_kills_the_whole_group(
    sets: SetFactory, pid_fifo: Path
) -> None:
    executor = cli_set(sets, ["--spawn-child", "--pid-file", str(pid_fifo), "--hang"])
    task = asyncio.create_task(executor.complete(chat()))
    child = await read_pid_fifo(pid_fifo)
    pgid = os.getpgid(child)
    assert pgid != os.getpgid(0)  # its own group, not ours
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_gone(child)
    await wait_gone(pgid)
    assert not group_alive(pgid)


async def test_a_group_ignoring_sigterm_is_killed_after_the_grace(
    sets: SetFactory, pid_fifo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_process, "KILL_GRACE_SECONDS", 0.2)
    executor = cli_set(
        sets, ["--ignore-sigterm", "--spawn-child", "--pid-file", str(pid_fifo), "--hang"]
    )
    task = asyncio.create_task(executor.complete(chat()))
    child = await read_pid_fifo(pid_fifo)
    pgid = os.getpgid(child)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_gone(pgid)
    await wait_gone(child)
    assert not group_alive(pgid)


async def test_adapter_statistics_count_live_groups_and_pending_kills(
    sets: SetFactory, pid_fifo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``AdapterSet.statistics()``: a running group is live; once its caller is cancelled a
    group that ignores SIGTERM is live with its kill pending until the grace ends — and the
    cancelled call ends only then (its slot is not free before its group is gone); then
    nothing. HTTP adapters report no process groups."""
    monkeypatch.setattr(cli_process, "KILL_GRACE_SECONDS", 0.2)
    args = [*FAKE_CLI[1:], "--ignore-sigterm", "--spawn-child", "--pid-file", str(pid_fifo)]
    adapter_set = sets(
        [
            {"name": "shell", "type": "cli", "command": FAKE_CLI[0], "args": [*args, "--hang"]},
            {"name": "api", "type": "openai_compat", "base_url": "http://127.0.0.1:1/v1"},
        ],
        [{"id": "c1", "type": "cli", "adapter": "shell"}],
    )

    def counts() -> list[tuple[str, str, int, int]]:
        return [
            (s.adapter, s.backend, s.live_process_groups, s.kills_pending)
            for s in adapter_set.statistics()
        ]

    assert counts() == [("shell", "cli", 0, 0), ("api", "http", 0, 0)]
    task = asyncio.create_task(adapter_set.for_provider("c1").complete(chat()))
    child = await read_pid_fifo(pid_fifo)
    assert counts()[0] == ("shell", "cli", 1, 0)
    task.cancel()
    await wait_for(lambda: counts()[0] == ("shell", "cli", 1, 1))  # SIGTERM ignored
    assert not task.done()  # the call waits for the reaper
    with pytest.raises(asyncio.CancelledError):
        await task
    assert counts()[0] == ("shell", "cli", 0, 0)
    await wait_gone(child)


async def test_aclose_of_an_abandoned_stream_kills_the_whole_group(
    sets: SetFactory, tmp_path: Path
) -> None:
    pid_file = tmp_path / "child.pid"
    executor = cli_set(sets, ["--spawn-child", "--pid-file", str(pid_file), "--hang-after", "1"])
    stream = await executor.open_stream(chat("one two three", stream=True))
    assert isinstance(stream, UpstreamStream)
    await anext(stream.frames)
    child = int(pid_file.read_text())
    pgid = os.getpgid(child)
    await stream.aclose()
    await stream.aclose()
    await wait_gone(child)
    await wait_gone(pgid)
    assert not group_alive(pgid)


async def test_orphans_of_a_finished_command_are_killed(sets: SetFactory, tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    executor = cli_set(sets, ["--spawn-child", "--pid-file", str(pid_file)])
    reply = await executor.complete(chat("done quickly"))
    assert reply_json(reply)["choices"][0]["message"]["content"] == "done quickly"
    child = int(pid_file.read_text())
    await wait_gone(child)
    assert not running(child)


async def test_adapter_set_aclose_kills_running_groups(pid_fifo: Path) -> None:
    from tests.helpers.adapters import build_set

    adapter_set = build_set(
        [
            {
                "name": "shell",
                "type": "cli",
                "command": FAKE_CLI[0],
                "args": [*FAKE_CLI[1:], "--spawn-child", "--pid-file", str(pid_fifo), "--hang"],
            }
        ],
        [{"id": "c1", "type": "cli", "adapter": "shell"}],
    )
    task = asyncio.create_task(adapter_set.for_provider("c1").complete(chat()))
    child = await read_pid_fifo(pid_fifo)
    pgid = os.getpgid(child)
    await adapter_set.aclose()  # returns once every group is reaped
    await wait_gone(child)
    assert not group_alive(pgid)
    with pytest.raises(AdapterError):
        await task
    with pytest.raises(AdapterError, match="closed"):
        await adapter_set.for_provider("c1").complete(chat())
