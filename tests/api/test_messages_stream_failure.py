"""A translated stream that the translation finds broken ends with its ``error`` event, and the
request path hears of it (an ``AdapterError`` that says the event is out)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from iop_edge.api.translated import translated_frames
from iop_edge.errors import AdapterError
from iop_edge.translate.messages_stream import MessagesStreamTranslator

HEAD = b'data: {"id":"c1","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
CALL = (
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1",'
    b'"type":"function","function":{"name":"f","arguments":"{not json"}}]}}]}\n\n'
)
FINISH = b'data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\n'


async def frames(*batches: bytes) -> AsyncIterator[bytes]:
    for batch in batches:
        yield batch


async def test_broken_tool_arguments_end_in_an_error_event_then_an_adapter_error():
    translator = MessagesStreamTranslator(model="m", estimated_input_tokens=3)
    written: list[bytes] = []

    async def relay() -> None:
        async for out in translated_frames(translator, frames(HEAD, CALL, FINISH)):
            written.append(out)

    with pytest.raises(AdapterError) as caught:
        await relay()
    stream = b"".join(written)
    assert stream.startswith(b"event: message_start\n")
    assert stream.endswith(b"\n\n")
    assert stream.rsplit(b"event: ", 1)[1].startswith(b"error\n")
    assert b"message_stop" not in stream
    assert caught.value.error_relayed
    assert caught.value.code == "upstream_error"
    assert caught.value.failure is None  # (the model's output, not the provider's health)


async def test_a_whole_answer_ends_with_message_stop_and_no_error():
    translator = MessagesStreamTranslator(model="m", estimated_input_tokens=3)
    text = b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    stop = b'data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    out = b"".join([o async for o in translated_frames(translator, frames(HEAD, text, stop))])
    assert out.endswith(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
    assert translator.failure is None
