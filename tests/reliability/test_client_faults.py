"""Client faults through the whole daemon: clients that leave, read slowly, send too much or
send hostile JSON. The daemon must answer what docs/api.md documents, keep its accounting
exact, and keep serving."""

# ruff: noqa: E501 - the hostile-body table reads best one row per line

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from iop_edge.config import parse_config
from iop_edge.daemon import Daemon
from iop_edge.testing.fake_behavior import FakeBehavior
from tests.helpers import FAKE_CLI, process_gone, settled, wait_for
from tests.helpers.upstreams import FRAME_CONTENT, WRITE_HIGH_WATER, EndlessUpstream

HELLO = [{"role": "user", "content": "hello edge"}]
JSON = {"Content-Type": "application/json"}
CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=30)  # bounds a broken run, never a timing


def client_doc(
    oa_url: str, ol_url: str, *, max_body_bytes: int = 8 * 1024 * 1024
) -> dict[str, Any]:
    """``chat-oa`` / ``chat-ol`` / ``chat-cli`` (the fake agent), one slot each."""

    def provider(pid: str, kind: str, adapter: str, **fields: Any) -> dict[str, Any]:
        return {
            "id": pid,
            "type": kind,
            "category": "cli" if kind == "cli" else "local_inference",
            "adapter": adapter,
            "models": ["fake-model"],
            "capacity": 1,
            **fields,
        }

    return {
        "openai": {"listen": "127.0.0.1:0", "max_body_bytes": max_body_bytes},
        "metrics": {"enabled": False},
        "console": {"enabled": False},
        "provider_pool": {"max_queue": 4, "queue_timeout_ms": 30000},
        "models": [
            {"id": f"chat-{p}", "context_window_tokens": 4096, "providers": [p]}
            for p in ("oa", "ol", "cli")
        ],
        "nodes": [
            {
                "id": "n1",
                "adapters": [
                    {"name": "oa", "type": "openai_compat", "base_url": oa_url},
                    {"name": "ol", "type": "ollama", "base_url": ol_url},
                    {"name": "shell", "type": "cli", "command": "cat"},
                ],
                "providers": [
                    provider("oa", "openai_compat", "oa"),
                    provider("ol", "ollama", "ol"),
                    provider(
                        "cli",
                        "cli",
                        "shell",
                        command=FAKE_CLI[0],
                        args=[*FAKE_CLI[1:], "--format", "stream-json"],
                        output_format="stream-json",
                    ),
                ],
            }
        ],
    }


@contextlib.asynccontextmanager
async def edge_for(doc: dict[str, Any]) -> AsyncIterator[Daemon]:
    """A daemon on ``doc``, stopped afterwards."""
    daemon = Daemon(parse_config(doc))
    await daemon.start()
    try:
        yield daemon
    finally:
        await daemon.stop()


async def post(
    daemon: Daemon, body: bytes | dict[str, Any], **kwargs: Any
) -> tuple[int, dict[str, Any]]:
    """POST to ``/v1/chat/completions``; the status and the JSON answer."""
    data = io.BytesIO(body if isinstance(body, bytes) else orjson.dumps(body))
    headers = {**JSON, **kwargs.pop("headers", {})}
    async with (
        aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session,
        session.post(
            daemon.openai_url + "/chat/completions", data=data, headers=headers, **kwargs
        ) as response,
    ):
        raw = await response.read()
    try:
        return response.status, orjson.loads(raw)
    except orjson.JSONDecodeError:  # aiohttp's own plain-text 500 page
        return response.status, {"raw": raw.decode(errors="replace")}


async def still_serving(daemon: Daemon) -> None:
    """A plain request after the fault is answered."""
    status, body = await post(daemon, {"model": "chat-oa", "messages": HELLO})
    assert (status, body["choices"][0]["message"]["content"]) == (200, "hello edge")


# --- clients that go away ----------------------------------------------------------------


async def test_a_client_gone_while_queued_is_counted_and_frees_its_place(fake_oa, fake_ol):
    """One request holds the only slot, a second waits; the second's client disconnects: it
    leaves the queue at once as ``client_gone``, the first completes, and the counters add up
    (submitted 2 = admitted 1 + client_gone 1)."""
    fake_oa.behavior = FakeBehavior(hold=True)
    async with edge_for(client_doc(fake_oa.base_url, fake_ol.base_url)) as daemon:
        first = asyncio.create_task(post(daemon, {"model": "chat-oa", "messages": HELLO}))
        await fake_oa.wait_in_flight(1)
        queued = asyncio.create_task(post(daemon, {"model": "chat-oa", "messages": HELLO}))
        await wait_for(lambda: daemon.scheduler.statistics().queue_depth == 1)
        queued.cancel()  # closes the client's connection
        with pytest.raises(asyncio.CancelledError):
            await queued
        await wait_for(lambda: daemon.scheduler.statistics().rejected["client_gone"] == 1)
        assert daemon.scheduler.statistics().queue_depth == 0
        fake_oa.release()
        assert (await first)[0] == 200
        stats = await settled(daemon)
    assert (stats.submitted, stats.admitted, stats.released) == (2, 1, 1)
    assert stats.rejected_total == 1
    assert fake_oa.total_requests == 1  # the abandoned request never reached the upstream


@pytest.mark.parametrize("model", ["chat-ol", "chat-cli"])
async def test_a_client_gone_mid_stream_cancels_the_upstream(fake_oa, fake_ol, tmp_path, model):
    """The client reads two events of a stream that then stalls, and goes away: the Ollama
    request is aborted (the fake sees its handler cancelled), or the agent's whole process
    group is killed (its forked child too); the slot is released once. (The OpenAI-compatible
    case is in ``tests/api/test_server.py``.)"""
    pid_file = tmp_path / "child.pid"
    if model == "chat-ol":
        content = FakeBehavior(fault="stall", fault_after=3).directive() + " one two three four"
    else:
        content = f"[[fake-cli: --hang-after 2 --spawn-child --pid-file {pid_file}]] one two three"
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": content}]}
    async with edge_for(client_doc(fake_oa.base_url, fake_ol.base_url)) as daemon:
        async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session:
            response = await session.post(daemon.openai_url + "/chat/completions", json=body)
            assert response.status == 200
            events = 0
            while events < 2:
                events += (await response.content.readline()).startswith(b"data: ")
            assert daemon.scheduler.statistics().in_flight == 1
            response.close()
        if model == "chat-ol":
            await fake_ol.wait_until(lambda: fake_ol.cancelled == 1)
        stats = await settled(daemon)
    assert (stats.admitted, stats.released, stats.double_releases) == (1, 1, 0)
    if model == "chat-cli":
        child = int(pid_file.read_text())
        await wait_for(lambda: process_gone(child))


# --- a slow reader -----------------------------------------------------------------------


def edge_unsent(daemon: Daemon) -> int:
    """The bytes the edge holds unsent for its clients (the write buffers of its client
    connections)."""
    server = daemon.listeners["openai"].runner.server
    assert server is not None
    return sum(
        h.transport.get_write_buffer_size() for h in server.connections if h.transport is not None
    )


def slow_doc(url: str) -> dict[str, Any]:
    return {
        "openai": {"listen": "127.0.0.1:0"},
        "metrics": {"enabled": False},
        "console": {"enabled": False},
        "models": [{"id": "big", "context_window_tokens": 4096, "providers": ["big"]}],
        "nodes": [
            {
                "id": "n1",
                "adapters": [{"name": "up", "type": "openai_compat", "base_url": url}],
                "providers": [
                    {
                        "id": "big",
                        "type": "openai_compat",
                        "category": "api",
                        "adapter": "up",
                        "models": ["m"],
                    }
                ],
            }
        ],
    }


async def test_a_client_that_stops_reading_pushes_back_to_the_upstream(fake_oa):
    """A client reads the first event of an endless stream (1 GiB), then stops reading. The
    edge must not buffer it: it stops reading its upstream connection, the upstream's own
    writes block (TCP flow control reached it), and meanwhile the edge holds at most one frame
    over aiohttp's high-water mark unsent. Then the client leaves; the upstream is cancelled
    and the slot released."""
    async with EndlessUpstream(frames=16384) as upstream, edge_for(slow_doc(upstream.url)) as d:
        async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session:
            response = await session.post(
                d.openai_url + "/chat/completions",
                json={"model": "big", "stream": True, "messages": HELLO},
            )
            await response.content.readline()
            # The upstream's writes block only when the edge has stopped reading its
            # connection (the edge's receive window is full): that is the push-back.
            await wait_for(upstream.blocked)
            assert edge_unsent(d) <= WRITE_HIGH_WATER + FRAME_CONTENT + 1024
            assert upstream.written < 256 * 1024 * 1024  # a small part of the 1 GiB
            response.close()
        stats = await settled(d)
    assert (stats.admitted, stats.released) == (1, 1)


async def test_a_slow_reader_gets_the_whole_stream_intact_with_bounded_edge_buffers():
    """A client reads a 4 MiB stream 16 KiB at a time, yielding to the loop between reads:
    at every read the edge holds at most one frame over the high-water mark unsent, and the
    client gets every byte and the final ``[DONE]``."""
    frames = 64
    async with EndlessUpstream(frames=frames) as upstream, edge_for(slow_doc(upstream.url)) as d:
        async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session:
            response = await session.post(
                d.openai_url + "/chat/completions",
                json={"model": "big", "stream": True, "messages": HELLO},
            )
            received = bytearray()
            worst = 0
            while chunk := await response.content.read(16 * 1024):
                received += chunk
                worst = max(worst, edge_unsent(d))
                for _ in range(5):
                    await asyncio.sleep(0)
            response.close()
        await settled(d)
    assert worst <= WRITE_HIGH_WATER + FRAME_CONTENT + 1024
    events = [e for e in bytes(received).split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    content = sum(len(json.loads(e[6:])["choices"][0]["delta"]["content"]) for e in events[:-1])
    assert content == frames * FRAME_CONTENT


# --- bodies too large ----------------------------------------------------------------------

LIMIT = 4096


def padded(size: int) -> bytes:
    """A valid request body of exactly ``size`` bytes (JSON whitespace as padding)."""
    body = orjson.dumps({"model": "chat-oa", "messages": HELLO})
    assert len(body) <= size
    return body[:-1] + b" " * (size - len(body)) + b"}"


async def test_body_size_limit_is_exact_and_holds_without_a_content_length(fake_oa, fake_ol):
    """``openai.max_body_bytes``: a body of exactly the limit is served; one byte more is 413
    ``request_too_large``; so is an oversized chunked body that declares no length; the
    daemon keeps serving and nothing was admitted for the refused ones."""
    doc = client_doc(fake_oa.base_url, fake_ol.base_url, max_body_bytes=LIMIT)
    async with edge_for(doc) as daemon:
        assert (await post(daemon, padded(LIMIT)))[0] == 200
        status, body = await post(daemon, padded(LIMIT + 1))
        assert (status, body["error"]["code"]) == (413, "request_too_large")

        async def chunked() -> AsyncIterator[bytes]:
            data = padded(LIMIT * 4)
            for start in range(0, len(data), 1000):
                yield data[start : start + 1000]

        async with (
            aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session,
            session.post(
                daemon.openai_url + "/chat/completions", data=chunked(), headers=JSON
            ) as response,
        ):
            assert "Content-Length" not in response.request_info.headers
            body = orjson.loads(await response.read())
        assert (response.status, body["error"]["code"]) == (413, "request_too_large")
        await still_serving(daemon)
        stats = await settled(daemon)
    assert (stats.submitted, stats.admitted) == (2, 2)


# --- malformed and hostile JSON ----------------------------------------------------------


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def chat(extra: str = "", messages: str = '[{"role":"user","content":"hi"}]') -> bytes:
    return f'{{"model":"chat-oa","messages":{messages}{extra}}}'.encode()


MANY = 100_000

# (id, body, expected status, expected code, expected param)
HOSTILE: list[Any] = [
    ("empty body", b"", 400, "invalid_request_error", None),
    ("not json", b"{oops", 400, "invalid_request_error", None),
    ("json null", b"null", 400, "invalid_request_error", None),
    ("json array", b"[]", 400, "invalid_request_error", None),
    ("non-utf8", b'{"model":"chat-oa","messages":[{"role":"user","content":"\xff\xfe"}]}',
     400, "invalid_request_error", None),
    ("lone surrogate", chat(messages='[{"role":"user","content":"\\ud800"}]'),
     400, "invalid_request_error", None),
    ("nested past the parser limit", chat(',"x":' + nested(100_000).decode()),
     400, "invalid_request_error", None),
    ("huge number", chat(',"max_tokens":1e400'), 400, "invalid_request_error", None),
    ("huge integer", chat(',"max_tokens":123456789012345678901234567890'),
     400, "invalid_request_error", "max_tokens"),
    ("model a number", b'{"model":5,"messages":[]}', 400, "invalid_request_error", "model"),
    ("messages a string", chat(messages='"hi"'), 400, "invalid_request_error", "messages"),
    ("message a string", chat(messages='["hi"]'), 400, "invalid_request_error", "messages[0]"),
    ("role a number", chat(messages='[{"role":5}]'), 400, "invalid_request_error", "messages[0]"),
    ("stream a string", chat(',"stream":"yes"'), 400, "invalid_request_error", "stream"),
    ("max_tokens negative", chat(',"max_tokens":-1'), 400, "invalid_request_error", "max_tokens"),
    ("max_tokens a bool", chat(',"max_tokens":true'), 400, "invalid_request_error", "max_tokens"),
    ("max_tokens a float", chat(',"max_tokens":1.5'), 400, "invalid_request_error", "max_tokens"),
    ("max_completion_tokens text", chat(',"max_completion_tokens":"8"'),
     400, "invalid_request_error", "max_completion_tokens"),
    ("thinking budget negative", chat(',"thinking_token_budget":-5'),
     400, "invalid_request_error", "thinking_token_budget"),
    ("gigantic messages array", chat(messages=json.dumps([{"role": "user", "content": "x"}] * MANY)),
     400, "context_length_exceeded", "messages"),
    ("gigantic array, bad last item",
     chat(messages=json.dumps([{"role": "user", "content": "x"}] * (MANY - 1) + [7])),
     400, "invalid_request_error", f"messages[{MANY - 1}]"),
    pytest.param(
        "tool_calls an int",
        chat(messages='[{"role":"assistant","content":"a","tool_calls":5},{"role":"user","content":"b"}]'),
        400, "invalid_request_error", "messages[0].tool_calls",
    ),
    pytest.param(
        "tools nested 300 deep", chat(',"tools":' + nested(300).decode()),
        400, "invalid_request_error", "tools",
    ),
    pytest.param(
        "unknown field nested 1000 deep", chat(',"x":' + nested(1000).decode()),
        400, "invalid_request_error", "x",
    ),
]  # fmt: skip


def _param(row: Any) -> Any:
    """A row as a ``pytest.param`` whose id is its first value (marks kept)."""
    if hasattr(row, "marks"):
        return pytest.param(*row.values[1:], id=row.values[0], marks=row.marks)
    return pytest.param(*row[1:], id=row[0])


@pytest.mark.parametrize(("body", "status", "code", "param"), [_param(r) for r in HOSTILE])
async def test_hostile_json_is_a_400_naming_the_field_never_a_500(
    fake_oa, fake_ol, body, status, code, param
):
    """Each hostile body gets its documented 4xx with the OpenAI envelope and the offending
    field in ``param`` where there is one — never a 500 — and the daemon keeps serving."""
    async with edge_for(client_doc(fake_oa.base_url, fake_ol.base_url)) as daemon:
        got_status, got = await post(daemon, body)
        await still_serving(daemon)
        await settled(daemon)
    assert got_status == status, got
    assert set(got["error"]) == {"message", "type", "param", "code"}
    assert (got["error"]["code"], got["error"]["param"]) == (code, param)


async def test_duplicate_keys_route_and_forward_the_same_value(fake_oa, fake_ol):
    """A body with ``model`` twice is served by the last value (orjson keeps the last), and
    the upstream receives one ``model`` key — the edge re-serialises the body, so the upstream
    can never read a different duplicate than the one the edge routed on."""
    raw = b'{"model":"nope","model":"chat-oa","messages":[{"role":"user","content":"hi"}]}'
    async with edge_for(client_doc(fake_oa.base_url, fake_ol.base_url)) as daemon:
        status, _ = await post(daemon, raw)
        await settled(daemon)
    assert status == 200
    assert fake_oa.requests[-1].json["model"] == "fake-model"
