"""Streams that stall or die (issue 25): a provider's ``first_token_timeout_ms`` and
``stream_idle_timeout_ms`` in every adapter, and a failed stream never presented as a clean end
(no ``data: [DONE]``, no chunk with a ``finish_reason``) — openai_compat's SSE relay, ollama's
NDJSON translation, cli's text and stream-json.

The bounds run on a fake clock the test moves (issue 26): a stream fails exactly at its
bound, never a millisecond before (:func:`tests.helpers.pass_deadline`), and no test waits for
one.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any

import pytest

from iop_edge.adapters import AdapterSet, StreamBounds, UpstreamCall, UpstreamReply, UpstreamStream
from iop_edge.adapters.cli import CliExecutor
from iop_edge.errors import AdapterError
from iop_edge.testing.clock import FakeClock
from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_ollama import FakeOllama
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers import FAKE_CLI, pass_deadline
from tests.helpers.adapters import chat, frames_until_error, payloads

SetFactory = Callable[..., AdapterSet]
BOUND_MS = 200
FIRST = StreamBounds(first_token_ms=BOUND_MS)
IDLE = StreamBounds(idle_ms=BOUND_MS)


def with_bounds(call: UpstreamCall, bounds: StreamBounds | None) -> UpstreamCall:
    return UpstreamCall(
        call.endpoint,
        call.body,
        call.target,
        call.stream,
        call.headers,
        call.request_id,
        call.model,
        call.estimated_prompt_tokens,
        bounds,
    )


def streamed(text: str = "one two three four", bounds: StreamBounds | None = None) -> UpstreamCall:
    return with_bounds(chat(text, stream=True), bounds)


def never_clean(frames: list[bytes]) -> None:
    """What a client got before a failure holds no sign of a finished answer."""
    assert b"data: [DONE]\n\n" not in frames
    for chunk in payloads(frames):
        for choice in chunk.get("choices", []):
            assert choice.get("finish_reason") is None, chunk


def http_executor(
    sets: SetFactory, kind: str, base_url: str, clock: FakeClock | None = None
) -> Any:
    adapter_set = sets(
        [{"name": "a", "type": kind, "base_url": base_url}],
        [{"id": "p1", "type": kind, "adapter": "a", "models": ["fake-model"]}],
        clock,
    )
    return adapter_set.for_provider("p1")


def cli_executor(
    sets: SetFactory, args: list[str], output_format: str = "text", clock: FakeClock | None = None
) -> Any:
    adapter_set = sets(
        [
            {
                "name": "shell",
                "type": "cli",
                "command": FAKE_CLI[0],
                "args": [*FAKE_CLI[1:], "--format", output_format, *args],
                "output_format": output_format,
            }
        ],
        [{"id": "c1", "type": "cli", "adapter": "shell"}],
        clock,
    )
    return adapter_set.for_provider("c1")


async def first_frame_error(executor: Any, call: UpstreamCall, clock: FakeClock) -> AdapterError:
    """The error of a stream that fails before its first frame (from open_stream, or from the
    first step of its frames — where the server looks for it, before the response head), the
    first-token bound passed on ``clock``. An HTTP stream opens at its response head: the
    bound passes after it came; a cli's waits for its first output, and the bound passes
    while it waits."""
    due = clock.now() + BOUND_MS / 1000
    deadline: asyncio.Task[None] | None = None

    async def start() -> bytes:
        nonlocal deadline
        if isinstance(executor, CliExecutor):
            deadline = asyncio.create_task(pass_deadline(clock, due))
        opened = await executor.open_stream(call)
        assert isinstance(opened, UpstreamStream)
        if deadline is None:  # the head came
            deadline = asyncio.create_task(pass_deadline(clock, due))
        return await opened.first()

    with pytest.raises(AdapterError) as caught:
        await start()
    assert deadline is not None
    await deadline  # at the bound, not before
    assert clock.now() == due
    return caught.value


# -- first_token_timeout_ms ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["openai_compat", "ollama"])
async def test_no_first_event_in_time_is_a_timeout_that_fails_over(
    sets: SetFactory, fake_oa: FakeOpenAI, fake_ol: FakeOllama, kind: str
) -> None:
    """The head came, then nothing: at ``first_token_timeout_ms`` (never before) the stream
    fails as a timeout before the client's first byte — failover allowed — and the upstream
    connection is closed (the fake sees its handler cancelled). Ollama's own role frame is
    not sent alone ahead of it."""
    fake = fake_oa if kind == "openai_compat" else fake_ol
    fake.behavior = FakeBehavior(fault="stall", fault_after=0)
    clock = FakeClock()
    executor = http_executor(sets, kind, fake.base_url, clock)
    error = await first_frame_error(executor, streamed(bounds=FIRST), clock)
    assert (error.code, error.status, error.failure, error.failover) == (
        "upstream_timeout",
        504,
        "timeout",
        True,
    )
    assert f"first_token_timeout_ms={BOUND_MS}" in str(error)
    async with asyncio.timeout(5):
        await fake.wait_until(lambda: fake.cancelled == 1 and fake.in_flight == 0)


async def test_a_cli_that_writes_nothing_in_time_fails_over_and_is_killed(
    sets: SetFactory,
) -> None:
    clock = FakeClock()
    executor = cli_executor(sets, ["--sleep", "30"], clock=clock)
    error = await first_frame_error(executor, streamed(bounds=FIRST), clock)
    assert (error.code, error.failure, error.failover) == ("upstream_timeout", "timeout", True)
    assert f"first_token_timeout_ms={BOUND_MS}" in str(error)
    assert "process group was killed" in str(error)


@pytest.mark.parametrize("kind", ["openai_compat", "ollama", "cli"])
async def test_a_first_event_in_time_meets_the_bound(
    sets: SetFactory, fake_oa: FakeOpenAI, fake_ol: FakeOllama, kind: str
) -> None:
    """An answer that starts in time is relayed whole: the bound does not cut it later, and
    an answer never waits on it (the same answer streams with the idle bound too)."""
    if kind == "cli":
        executor = cli_executor(sets, [])
    else:
        executor = http_executor(
            sets, kind, (fake_oa if kind == "openai_compat" else fake_ol).base_url
        )
    opened = await executor.open_stream(
        streamed(bounds=StreamBounds(first_token_ms=BOUND_MS, idle_ms=BOUND_MS))
    )
    assert isinstance(opened, UpstreamStream)
    async with opened:
        relayed = b"".join([frame async for frame in opened.frames])
    assert relayed.endswith(b"data: [DONE]\n\n")


# -- stream_idle_timeout_ms ---------------------------------------------------------------------


async def idle_error(
    stream: UpstreamStream | UpstreamReply, clock: FakeClock
) -> tuple[list[bytes], AdapterError]:
    """The frames of ``stream`` and the error that ends it once it has been idle for
    ``BOUND_MS`` on ``clock`` (the bound counts from the wait for the upstream's next frame,
    armed once the first frames went out)."""
    due = clock.now() + BOUND_MS / 1000
    deadline = asyncio.create_task(pass_deadline(clock, due))
    frames, error = await frames_until_error(stream)
    await deadline  # at the bound, not before
    return frames, error


@pytest.mark.parametrize("kind", ["openai_compat", "ollama"])
async def test_a_stream_idle_past_its_bound_fails_mid_stream(
    sets: SetFactory, fake_oa: FakeOpenAI, fake_ol: FakeOllama, kind: str
) -> None:
    """Three frames, then silence: ``stream_idle_timeout_ms`` after the last one the frames
    raise ``upstream_timeout`` (no failover: the client has bytes); what came before is the
    client's, and nothing of it says the answer finished."""
    fake = fake_oa if kind == "openai_compat" else fake_ol
    fake.behavior = FakeBehavior(fault="stall", fault_after=3)
    clock = FakeClock()
    executor = http_executor(sets, kind, fake.base_url, clock)
    frames, error = await idle_error(await executor.open_stream(streamed(bounds=IDLE)), clock)
    assert frames
    never_clean(frames)
    assert (error.code, error.failure, error.failover) == ("upstream_timeout", "timeout", False)
    assert f"stream_idle_timeout_ms={BOUND_MS}" in str(error)


async def test_a_cli_stream_idle_past_its_bound_fails_and_is_killed(sets: SetFactory) -> None:
    clock = FakeClock()
    executor = cli_executor(sets, ["--hang-after", "1"], "stream-json", clock)
    frames, error = await idle_error(await executor.open_stream(streamed(bounds=IDLE)), clock)
    assert payloads(frames)[1]["choices"][0]["delta"] == {"content": "one "}
    never_clean(frames)
    assert (error.code, error.failover) == ("upstream_timeout", False)
    assert f"stream_idle_timeout_ms={BOUND_MS}" in str(error)


# -- every other death: never a clean end --------------------------------------------------------


@pytest.mark.parametrize("fault", ["reset", "malformed", "error"])
@pytest.mark.parametrize("kind", ["openai_compat", "ollama"])
async def test_an_http_stream_that_dies_never_ends_clean(
    sets: SetFactory, fake_oa: FakeOpenAI, fake_ol: FakeOllama, kind: str, fault: str
) -> None:
    fake = fake_oa if kind == "openai_compat" else fake_ol
    fake.behavior = FakeBehavior(fault=fault, fault_after=2)  # type: ignore[arg-type]
    executor = http_executor(sets, kind, fake.base_url)
    frames, error = await frames_until_error(await executor.open_stream(streamed()))
    never_clean(frames)
    assert error.code == "upstream_error"


async def test_an_http_stream_past_request_timeout_never_ends_clean(
    sets: SetFactory, fake_oa: FakeOpenAI
) -> None:
    fake_oa.behavior = FakeBehavior(fault="stall", fault_after=2)
    clock = FakeClock()
    adapter_set = sets(
        [{"name": "a", "type": "openai_compat", "base_url": fake_oa.base_url}],
        [{"id": "p1", "type": "openai_compat", "adapter": "a", "request_timeout_ms": BOUND_MS}],
        clock,
    )
    due = clock.now() + BOUND_MS / 1000
    stream = await adapter_set.for_provider("p1").open_stream(streamed())
    frames: list[bytes] = []
    # mid-stream: once the two frames came (the role frame and the first words)
    deadline = asyncio.create_task(pass_deadline(clock, due, lambda: len(frames) >= 2))
    _, error = await frames_until_error(stream, frames)
    await deadline
    never_clean(frames)
    assert (error.code, error.failover) == ("upstream_timeout", False)


@pytest.mark.parametrize(
    ("args", "output_format", "timeout_ms"),
    [
        (["--hang-after", "1"], "text", BOUND_MS),  # killed at request_timeout_ms
        (["--exit-code", "3", "--answer-then-exit"], "text", None),  # a crash after output
        (["--exit-code", "3", "--answer-then-exit"], "stream-json", None),
        (["--reply", "ok"], "json-lines-broken", None),  # a malformed line
    ],
)
async def test_a_cli_stream_that_dies_never_ends_clean(
    sets: SetFactory, args: list[str], output_format: str, timeout_ms: int | None
) -> None:
    provider: dict[str, Any] = {"request_timeout_ms": timeout_ms} if timeout_ms else {}
    clock = FakeClock() if timeout_ms else None
    if output_format == "json-lines-broken":
        script = (  # the broken line after a pause: it fails mid-stream, not before it
            "import sys, time; sys.stdin.read(); "
            'print(\'{"type": "content", "content": "fine"}\', flush=True); '
            "time.sleep(0.2); print('not json')"
        )
        adapter = {"command": sys.executable, "args": ["-c", script]}
        output_format = "stream-json"
    else:
        adapter = {
            "command": FAKE_CLI[0],
            "args": [*FAKE_CLI[1:], "--format", output_format, *args],
        }
    adapter_set = sets(
        [{"name": "shell", "type": "cli", "output_format": output_format, **adapter}],
        [{"id": "c1", "type": "cli", "adapter": "shell", **provider}],
        clock,
    )
    stream = await adapter_set.for_provider("c1").open_stream(streamed())
    frames: list[bytes] = []
    deadline = None
    if clock is not None and timeout_ms is not None:  # killed at request_timeout_ms, once
        due = clock.now() + timeout_ms / 1000  # the first words came (it hangs after them)
        deadline = asyncio.create_task(pass_deadline(clock, due, lambda: len(frames) >= 2))
    _, error = await frames_until_error(stream, frames)
    if deadline is not None:
        await deadline
    never_clean(frames)
    assert error.code in ("upstream_error", "upstream_timeout")
