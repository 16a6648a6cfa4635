"""Shared builders for the adapter tests: configs through the real loader, calls, frames, a
hand-written upstream, and event-driven checks that a process is gone. The fixtures built on
them (``sets``, ``pid_fifo``) are in ``tests/adapters/conftest.py``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from aiohttp import web

from iop_edge.adapters import AdapterSet, Executor, UpstreamCall, UpstreamReply, UpstreamStream
from iop_edge.config import load_config
from iop_edge.config.payload import node_payload
from iop_edge.errors import AdapterError
from iop_edge.seams import Clock

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
"""An aiohttp request handler (a hand-written upstream's, for :func:`serve`)."""

"""The fake agent as a cli command: ``command`` then ``args``."""


def config_text(adapters: list[dict[str, Any]], providers: list[dict[str, Any]]) -> str:
    """An edge.yaml with one node ``n1`` holding ``adapters`` and ``providers``; every provider
    serves the model ``m`` (its upstream target, unless the provider entry says otherwise)."""
    doc = {
        "models": [
            {
                "id": "m",
                "context_window_tokens": 8192,
                "providers": [p["id"] for p in providers if p.get("enabled", True)],
            }
        ],
        "nodes": [{"id": "n1", "adapters": adapters, "providers": providers}],
    }
    for provider in providers:
        provider.setdefault("models", ["m"])
        provider.setdefault("category", "cli" if provider["type"] == "cli" else "local_inference")
    return yaml.safe_dump(doc, sort_keys=False)


def build_set(
    adapters: list[dict[str, Any]], providers: list[dict[str, Any]], clock: Clock | None = None
) -> AdapterSet:
    """The node's AdapterSet, through load_config and node_payload as the daemon builds it,
    its deadlines on ``clock`` (the loop's when None)."""
    config = load_config(config_text(adapters, providers))
    return AdapterSet.from_payload(node_payload(config, "n1"), clock)


def chat(
    text: str = "hello upstream world",
    *,
    stream: bool = False,
    target: str = "fake-model",
    headers: Mapping[str, str] | None = None,
    request_id: str = "req-1",
    model: str = "",
    estimated_prompt_tokens: int | None = None,
    **fields: Any,
) -> UpstreamCall:
    """A chat call with one user message (plus ``fields`` in the body); ``model`` is the
    client's model id (the answers' ``model``), empty for the target."""
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": text}],
        **fields,
    }
    if stream:
        body["stream"] = True
    return UpstreamCall(
        endpoint="chat/completions",
        body=body,
        target=target,
        stream=stream,
        headers=dict(headers or {}),
        request_id=request_id,
        model=model,
        estimated_prompt_tokens=estimated_prompt_tokens,
    )


def reply_json(reply: UpstreamReply | UpstreamStream) -> Any:
    """The parsed body of a reply (failing the test on a stream)."""
    assert isinstance(reply, UpstreamReply), f"expected a reply, got {reply!r}"
    return orjson.loads(reply.body)


def split_frames(relayed: bytes) -> list[bytes]:
    """The SSE frames in what a stream yielded at once (it relays what arrived together as one
    piece); each keeps its ``\\n\\n``. A piece must hold whole frames only."""
    assert relayed.endswith(b"\n\n"), relayed
    return [frame + b"\n\n" for frame in relayed[:-2].split(b"\n\n")]


async def collect(stream: UpstreamStream | UpstreamReply) -> list[bytes]:
    """Every frame of a stream, closing it after."""
    assert isinstance(stream, UpstreamStream), f"expected a stream, got {stream!r}"
    async with stream:
        return [frame async for piece in stream.frames for frame in split_frames(piece)]


async def frames_until_error(
    stream: UpstreamStream | UpstreamReply, received: list[bytes] | None = None
) -> tuple[list[bytes], Any]:
    """The frames a stream yields before it raises AdapterError, and that error (closed after);
    each frame is appended to ``received`` (when given) as it comes.

    Fails the test when the stream ends without an error.
    """
    assert isinstance(stream, UpstreamStream), f"expected a stream, got {stream!r}"
    received = [] if received is None else received
    async with stream:
        try:
            async for piece in stream.frames:
                received.extend(split_frames(piece))
        except AdapterError as exc:
            return received, exc
    pytest.fail(f"the stream ended without an error after {len(received)} frames")


def payloads(frames: list[bytes]) -> list[Any]:
    """The JSON payloads of ``data:`` frames, ``"[DONE]"`` kept as the string."""
    out: list[Any] = []
    for frame in frames:
        assert frame.startswith(b"data: "), frame
        assert frame.endswith(b"\n\n"), frame
        data = frame[6:-2]
        out.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
    return out


def content_of(chunks: list[Any]) -> str:
    """The text the content deltas of chat chunks add up to."""
    return "".join(
        choice["delta"].get("content") or ""
        for chunk in chunks
        if isinstance(chunk, dict)
        for choice in chunk["choices"]
    )


class CannedUpstream:
    """A hand-written upstream for :func:`serve`: answers each POST with ``chunks`` (one
    write each, so a test chooses how the body is cut into reads) and keeps what it received
    (path and parsed JSON body)."""

    def __init__(
        self,
        chunks: Sequence[bytes],
        *,
        status: int = 200,
        content_type: str = "text/event-stream",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.chunks = chunks
        self.status = status
        self.content_type = content_type
        self.headers = headers or {}
        self.received: list[tuple[str, Any]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """The aiohttp handler."""
        self.received.append((request.path, orjson.loads(await request.read())))
        response = web.StreamResponse(
            status=self.status, headers={"Content-Type": self.content_type, **self.headers}
        )
        await response.prepare(request)
        for chunk in self.chunks:
            await response.write(chunk)
        await response.write_eof()
        return response


@dataclass
class Relayed:
    """What a stream relayed: its frames joined, the error it ended with (None: a clean end),
    and the stream itself (closed), for its usage and what else it captured."""

    frames: bytes
    error: AdapterError | None
    stream: UpstreamStream


async def run_call(executor: Executor, call: UpstreamCall) -> UpstreamReply | Relayed:
    """The executor's result for ``call``: a reply, or what its stream relayed."""
    if not call.stream:
        return await executor.complete(call)
    opened = await executor.open_stream(call)
    if isinstance(opened, UpstreamReply):
        return opened
    received: list[bytes] = []
    try:
        async with opened:
            async for piece in opened.frames:
                received.append(piece)
    except AdapterError as exc:
        return Relayed(b"".join(received), exc, opened)
    return Relayed(b"".join(received), None, opened)


@contextlib.asynccontextmanager
async def serve(path: str, handler: Handler) -> AsyncIterator[str]:
    """Serve ``handler`` on ``POST path`` at 127.0.0.1 (a hand-written upstream for wire
    details the fakes do not produce); yield its origin ``http://127.0.0.1:PORT``."""
    app = web.Application()
    app.router.add_post(path, handler)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def dead_port() -> int:
    """A TCP port on 127.0.0.1 with nothing listening (bound once, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


async def wait_gone(pid: int, timeout: float = 10.0) -> None:
    """Return once process ``pid`` has exited (event-driven, via a pidfd); fail after timeout."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop = asyncio.get_running_loop()
    exited = loop.create_future()

    def readable() -> None:
        if not exited.done():
            exited.set_result(None)

    loop.add_reader(pidfd, readable)
    try:
        async with asyncio.timeout(timeout):
            await exited
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)


async def read_pid_fifo(path: Path) -> int:
    """Read the pid the fake CLI writes to the FIFO ``path`` (blocks until it writes)."""

    def read() -> int:
        with open(path, encoding="utf-8") as fifo:
            return int(fifo.read().strip())

    return await asyncio.to_thread(read)
