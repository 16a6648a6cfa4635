"""HTTP/1.1 spoken byte by byte on a raw socket, as no client library would let a test speak it:
a request built from bytes (header values may hold any byte), one answer read with its headers,
or everything the peer sends until it closes. Every read is bounded by
:data:`~iop_edge.testing.leaks.BOUND`, so an edge that never answers fails the run instead of
hanging it. The hostile-client tests and ``bench/soak.py`` (through
:mod:`iop_edge.testing.edge_process`) use them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

from iop_edge.testing.leaks import BOUND


async def raw_exchange(host: str, port: int, request: bytes) -> tuple[int, bytes]:
    """Send ``request`` (whole, as bytes: a client no library would let us be) on a new
    connection and read the answer to the end; the status and the body."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(BOUND):
            raw = await reader.read()
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split(b" ")
    return int(status_line[1]), body


def raw_request(
    method: str,
    path: str,
    headers: Sequence[tuple[bytes, bytes]] = (),
    body: bytes = b"",
    *,
    host: bytes = b"127.0.0.1",
) -> bytes:
    """An HTTP/1.1 request built byte by byte (header values may hold any byte), with
    ``Connection: close`` and the body's ``Content-Length``."""
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: " + host]
    lines += [name + b": " + value for name, value in headers]
    if body or method == "POST":
        lines.append(b"Content-Length: %d" % len(body))
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


@dataclass
class RawAnswer:
    """One HTTP/1.1 answer read off a raw socket: status, headers (lower-case names), body."""

    status: int
    headers: dict[str, str]
    body: bytes


async def read_answer(reader: asyncio.StreamReader) -> RawAnswer:
    """Read one answer (head, then a ``Content-Length`` body, or the rest until EOF) from a
    connection on which the request was sent; bounded by :data:`BOUND`."""
    async with asyncio.timeout(BOUND):
        head = await reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers: dict[str, str] = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            if name:
                headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
        else:
            body = await reader.read()
    return RawAnswer(int(status_line.split(" ")[1]), headers, body)


async def raw_answer(host: str, port: int, request: bytes) -> RawAnswer:
    """Send ``request`` on a new connection and read its answer with its headers (what
    :func:`raw_exchange` gives, and the headers: ``Retry-After``, ``Connection``, ...)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        await writer.drain()
        return await read_answer(reader)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the peer sends until it closes the connection (EOF or reset); raises
    TimeoutError when it has not closed within :data:`BOUND`."""
    received = b""
    async with asyncio.timeout(BOUND):
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(65536):
                received += chunk
    return received
