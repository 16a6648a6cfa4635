"""Benchmark: the CPU the Messages and Responses translation costs per request (issues 27 and
28), alone.

The proxy benchmark's answer — the fake OpenAI upstream's 16-chunk reply to the load
generator's prompt, fetched once from a real :class:`~iop_edge.testing.fake_openai.FakeOpenAI`
(its chat stream with the usage chunk, as the edge asks for it, and its chat completion) — goes
through what the edge does to a translated ``/v1/messages`` request besides what it does to a
chat one: parsing the Messages body into the internal form
(:meth:`~iop_edge.api.messages.MessagesSurface.parse`), the chat stream's frames into
Messages' event stream (:class:`~iop_edge.translate.messages_stream.MessagesStreamTranslator`:
one ``feed`` per frame, as when each frame arrives alone, and one ``feed`` of them all, as when
they arrive together), and the completion into a Message; and what it does to a translated
``/v1/responses`` one (``store: false``): the same four with
:meth:`~iop_edge.api.responses.ResponsesSurface.parse`,
:class:`~iop_edge.translate.responses_stream.ResponsesStreamTranslator` and
:func:`~iop_edge.translate.responses_reply.render_response`, and what ``store: true`` adds at
the stream's end (the final Response kept, with its conversation, in a store of the
default bounds — 1,000 responses, 64 MiB — full, so that each put evicts one). Each figure is
the best of several runs of CPU time (``time.process_time``) per request: the least the work
costs, which a shared machine can only make slower. ``bench/bench_surfaces.py`` measures the
whole edge.

Run: ``.venv/bin/python bench/bench_translate.py [--requests 2000] [--runs 7]``
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from loadgen import PROMPT

from iop_edge.api.messages import MESSAGES_SURFACE
from iop_edge.api.responses import ResponsesSurface
from iop_edge.api.responses_store import ResponsesStore
from iop_edge.config.schema import (
    DEFAULT_RESPONSES_MAX_BYTES,
    DEFAULT_RESPONSES_MAX_ITEMS,
    DEFAULT_RESPONSES_TTL_MS,
)
from iop_edge.testing.clock import FakeClock
from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from iop_edge.translate.chat_events import decode_completion
from iop_edge.translate.messages_reply import message_body
from iop_edge.translate.messages_stream import MessagesStreamTranslator
from iop_edge.translate.responses_reply import render_response
from iop_edge.translate.responses_stream import ResponsesStreamTranslator
from iop_edge.translate.sse import dumps

MODEL = "bench-model"
ESTIMATED_INPUT_TOKENS = 30


async def upstream_answers() -> tuple[bytes, bytes]:
    """The fake's chat stream (every frame) and chat completion for the benchmark's prompt."""
    request = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 64,
    }
    async with (
        FakeOpenAI(behavior=FakeBehavior(chunks=16), models=(MODEL,)) as fake,
        aiohttp.ClientSession() as session,
    ):
        url = fake.base_url + "/chat/completions"
        streamed = {**request, "stream": True, "stream_options": {"include_usage": True}}
        async with session.post(url, json=streamed) as response:
            stream = await response.read()
        async with session.post(url, json=request) as response:
            completion = await response.read()
    return stream, completion


def cases(stream: bytes, completion: bytes) -> dict[str, Callable[[], object]]:
    """Each measured piece of work, for one request."""
    frames = [frame + b"\n\n" for frame in stream.split(b"\n\n") if frame]
    body = orjson.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 64,
            "stream": True,
        }
    )
    return {
        **_messages_cases(body, frames, stream, completion),
        **_responses_cases(frames, stream, completion),
    }


def _messages_cases(
    body: bytes, frames: list[bytes], stream: bytes, completion: bytes
) -> dict[str, Callable[[], object]]:
    def translator() -> MessagesStreamTranslator:
        return MessagesStreamTranslator(model=MODEL, estimated_input_tokens=ESTIMATED_INPUT_TOKENS)

    def feed_each() -> object:
        translating = translator()
        out = [translating.feed(frame) for frame in frames]
        return out, translating.end()

    def feed_all() -> object:
        translating = translator()
        return translating.feed(stream), translating.end()

    return {
        "parse the Messages request": lambda: MESSAGES_SURFACE.parse(body, {}, None),
        f"Messages stream: {len(frames)} frames, a feed per frame": feed_each,
        f"Messages stream: {len(frames)} frames, one feed": feed_all,
        "non-streamed: the completion as a Message": lambda: message_body(
            decode_completion(completion),
            model=MODEL,
            estimated_input_tokens=ESTIMATED_INPUT_TOKENS,
        ),
    }


def _responses_cases(
    frames: list[bytes], stream: bytes, completion: bytes
) -> dict[str, Callable[[], object]]:
    body = orjson.dumps(
        {
            "model": MODEL,
            "input": PROMPT,
            "max_output_tokens": 64,
            "store": False,
            "stream": True,
        }
    )
    clock = FakeClock()
    store = ResponsesStore(
        max_items=DEFAULT_RESPONSES_MAX_ITEMS,
        max_bytes=DEFAULT_RESPONSES_MAX_BYTES,
        ttl=DEFAULT_RESPONSES_TTL_MS / 1000,
        clock=clock,
    )
    surface = ResponsesSurface(lambda: store)
    stored = surface.parse(body.replace(b'"store":false', b'"store":true'), {}, None)
    echo = stored.translated.echo
    ids = iter(range(10**9))

    def translator() -> ResponsesStreamTranslator:
        return ResponsesStreamTranslator(
            response_id="resp_0123456789ab000000000000000001",
            created_at=1_800_000_000,
            model=MODEL,
            echo=echo,
            estimated_input_tokens=ESTIMATED_INPUT_TOKENS,
        )

    def feed_each() -> object:
        translating = translator()
        out = [translating.feed(frame) for frame in frames]
        return out, translating.end()

    def feed_all() -> object:
        translating = translator()
        return translating.feed(stream), translating.end()

    finished = translator()
    finished.feed(stream)
    finished.end()
    final, final_json = finished.response, finished.response_json
    assert final is not None, "the translated stream did not end"
    assert final_json is not None
    for _ in range(DEFAULT_RESPONSES_MAX_ITEMS):  # full: each put from now on evicts one
        stored.keep(f"resp_{next(ids)}", final_json, final)

    def keep() -> object:
        # as the renderer does at the stream's end: the last event's JSON, kept with the items
        clock.advance(0.001)
        stored.keep(f"resp_{next(ids)}", final_json, final)
        return None

    return {
        "parse the Responses request": lambda: surface.parse(body, {}, None),
        f"Responses stream: {len(frames)} frames, a feed per frame": feed_each,
        f"Responses stream: {len(frames)} frames, one feed": feed_all,
        "store: true: the final Response kept": keep,
        "non-streamed: the completion as a Response": lambda: dumps(
            render_response(
                decode_completion(completion),
                response_id="resp_0123456789ab000000000000000001",
                created_at=1_800_000_000,
                model=MODEL,
                echo=echo,
                estimated_input_tokens=ESTIMATED_INPUT_TOKENS,
            )
        ),
    }


def best_micros(work: Callable[[], object], requests: int, runs: int) -> float:
    """The best of ``runs`` runs of CPU µs per call, ``requests`` calls each."""
    times = timeit.repeat(work, number=requests, repeat=runs, timer=time.process_time)
    return min(times) / requests * 1e6


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=2000, help="calls per run")
    parser.add_argument("--runs", type=int, default=7, help="runs (the best is reported)")
    args = parser.parse_args()
    stream, completion = asyncio.run(upstream_answers())
    print(
        f"Python {platform.python_version()}; the fake's 16-chunk answer ({len(stream)} bytes "
        f"of stream); best of {args.runs} runs of {args.requests:,} requests\n"
    )
    print("| work per translated request | CPU µs |\n| --- | ---: |")
    for name, work in cases(stream, completion).items():
        print(f"| {name} | {best_micros(work, args.requests, args.runs):.1f} |")


if __name__ == "__main__":
    main()
