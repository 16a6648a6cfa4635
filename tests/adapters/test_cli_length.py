"""``max_tokens`` / ``max_completion_tokens`` on a ``cli`` provider (issue 25): enforced by the
edge. Once the answer's estimate (``ceil(UTF-8 bytes / 4)``, the cli usage estimate) reaches
the limit the edge stops reading, ends the process group (the call returns once it is reaped)
and answers with ``finish_reason: "length"`` and the estimated usage."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from iop_edge.adapters import AdapterSet, UpstreamCall, UpstreamStream
from iop_edge.adapters.cli import OutputDecoder
from tests.helpers import FAKE_CLI
from tests.helpers.adapters import chat, collect, content_of, payloads, reply_json

SetFactory = Callable[..., AdapterSet]
# 200 words of 5 bytes; the fake stops after 100 of them and hangs: only a cut ends the call
# before request_timeout_ms.
LONG = "word " * 200
REPLY = ["--reply", LONG, "--hang-after", "100"]


def long_answer(sets: SetFactory, output_format: str) -> tuple[AdapterSet, Any]:
    adapter_set = sets(
        [
            {
                "name": "shell",
                "type": "cli",
                "command": FAKE_CLI[0],
                "args": [*FAKE_CLI[1:], "--format", output_format, *REPLY],
                "output_format": output_format,
            }
        ],
        [{"id": "c1", "type": "cli", "adapter": "shell", "request_timeout_ms": 10_000}],
    )
    return adapter_set, adapter_set.for_provider("c1")


def live_groups(adapter_set: AdapterSet) -> int:
    return sum(s.live_process_groups for s in adapter_set.statistics())


@pytest.mark.parametrize("output_format", ["text", "stream-json"])
@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
async def test_a_cli_answer_is_cut_at_max_tokens(
    sets: SetFactory, output_format: str, field: str
) -> None:
    adapter_set, executor = long_answer(sets, output_format)
    limit: dict[str, Any] = {field: 10}
    call = chat("write a lot", estimated_prompt_tokens=7, **limit)
    answer = reply_json(await executor.complete(call))
    assert live_groups(adapter_set) == 0  # the group was ended, and reaped before the answer
    [choice] = answer["choices"]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] == "word " * 8  # 40 bytes: an estimate of 10 tokens
    assert answer["usage"]["completion_tokens"] == 10
    assert answer["usage"]["prompt_tokens"] == 7


@pytest.mark.parametrize("output_format", ["text", "stream-json"])
async def test_a_streamed_cli_answer_ends_with_length_at_max_tokens(
    sets: SetFactory, output_format: str
) -> None:
    adapter_set, executor = long_answer(sets, output_format)
    call = chat(
        "write a lot",
        stream=True,
        max_tokens=10,
        stream_options={"include_usage": True},
        estimated_prompt_tokens=7,
    )
    stream = await executor.open_stream(call)
    assert isinstance(stream, UpstreamStream)
    chunks = payloads(await collect(stream))
    assert live_groups(adapter_set) == 0
    assert chunks[-1] == "[DONE]"
    assert content_of(chunks[:-1]) == "word " * 8
    assert chunks[-3]["choices"][0]["finish_reason"] == "length"
    assert chunks[-2]["usage"]["completion_tokens"] == 10
    assert stream.usage.estimated


async def test_an_answer_within_max_tokens_is_not_cut(sets: SetFactory) -> None:
    adapter_set = sets(
        [{"name": "shell", "type": "cli", "command": FAKE_CLI[0], "args": FAKE_CLI[1:]}],
        [{"id": "c1", "type": "cli", "adapter": "shell"}],
    )
    call: UpstreamCall = chat("short", max_tokens=2)  # 5 bytes: an estimate of 2
    answer = reply_json(await adapter_set.for_provider("c1").complete(call))
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert answer["choices"][0]["message"]["content"] == "short"


def test_the_cut_falls_on_a_character_boundary() -> None:
    """A multi-byte character that would cross the limit is left out whole."""
    decoder = OutputDecoder("text", max_tokens=1)  # 4 bytes
    pieces = decoder.feed("ab한글".encode())  # 2 + 3 + 3 bytes
    assert pieces == ["ab"]
    assert decoder.cut
    assert decoder.feed(b"more") == []
