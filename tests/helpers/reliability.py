"""Machinery of the hostile-client tests (issue 10): slowloris clients, stalled readers,
config files saved the hostile way, and ``iop-edge config validate`` as an operator runs it.
The hostile upstreams are in :mod:`tests.helpers.upstreams`.

``iop-edge serve`` as a subprocess (:class:`EdgeProcess`) and what an operator reads back of
it (log events, ``/admin/status``, ``/metrics``), raw HTTP on a socket, and the provider that
goes down and comes back (:class:`FlappingUpstream`, issue 12) live in ``iop_edge.testing``
(``edge_process``, ``raw_http``, ``flapping``), which ``bench/soak.py`` runs at full size;
they are re-exported here. So are, in :mod:`tests.helpers`, the waiting and leak accounting.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from iop_edge.testing.edge_process import (
    EdgeProcess,
    edge_at_rest,
    edge_metrics,
    edge_process,
    edge_status,
    log_events,
    status_leaks,
    wait_for_log,
)
from iop_edge.testing.flapping import FlappingUpstream, FlapState
from iop_edge.testing.leaks import BOUND
from iop_edge.testing.raw_http import (
    RawAnswer,
    raw_answer,
    raw_exchange,
    raw_request,
    read_answer,
    until_closed,
)

__all__ = [
    "EdgeProcess",
    "FlapState",
    "FlappingUpstream",
    "RawAnswer",
    "Trickled",
    "config_validate",
    "edge_at_rest",
    "edge_metrics",
    "edge_process",
    "edge_status",
    "log_events",
    "raw_answer",
    "raw_exchange",
    "raw_request",
    "read_answer",
    "read_until_closed",
    "slowloris",
    "split_save",
    "stalled_reader",
    "status_leaks",
    "swap_in_fifo",
    "until_closed",
    "wait_for_log",
]


@dataclass
class Trickled:
    """What a slowloris connection saw: seconds from the moment it started connecting until
    the edge closed it (so never less than the edge's timeout), how many bytes it trickled,
    and what the edge sent it after ``first``'s answer."""

    seconds: float
    sent: int
    received: bytes


async def slowloris(
    host: str, port: int, head: bytes, *, pace: float, first: bytes = b"", at_once: bytes = b""
) -> Trickled:
    """A slowloris client: on a new connection (after ``first``, a whole request whose answer
    is read, when given, and ``at_once``, bytes sent in one go: a complete head whose body is
    then trickled) send ``head`` — an incomplete request head, or part of a body — one byte
    every ``pace`` seconds, then padding, until the edge closes the connection.

    The pace is the attack's own rhythm, not a synchronisation: the test waits on the close
    (bounded by :data:`BOUND`, so an edge that never closes fails the test instead of hanging).
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    reader, writer = await asyncio.open_connection(host, port)
    sent = 0

    async def trickle() -> None:
        nonlocal sent
        data = head
        with contextlib.suppress(ConnectionError):
            while True:
                if sent >= len(data):
                    data += b"a" * 64  # a header value that never ends
                writer.write(data[sent : sent + 1])
                sent += 1
                await writer.drain()
                await asyncio.sleep(pace)

    try:
        if first:
            writer.write(first)
            await writer.drain()
            answer = await read_answer(reader)
            assert answer.status == 200, answer
        if at_once:
            writer.write(at_once)
            await writer.drain()
        trickling = asyncio.create_task(trickle())
        try:
            received = await until_closed(reader)
        finally:
            trickling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await trickling
        return Trickled(loop.time() - started, sent, received)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def stalled_reader(host: str, port: int, request: bytes) -> socket.socket:
    """A client that sends ``request`` and then never reads: a blocking socket with a small
    receive buffer (so the edge's writes have to wait soon). The caller closes it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(BOUND)
    sock.connect((host, port))
    sock.sendall(request)
    return sock


def read_until_closed(sock: socket.socket) -> tuple[bytes, str]:
    """Read a blocking socket until the peer closes it: the bytes, and ``"eof"`` or
    ``"reset"``; raises TimeoutError when it stays open past :data:`BOUND`."""
    received = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return received, "reset"
        if not chunk:
            return received, "eof"
        received += chunk


def split_save(path: Path, first: str, second: str, *, pause: float) -> None:
    """Save ``first + second`` in place the way a slow writer does: truncate, write and flush
    ``first``, wait ``pause`` seconds, write ``second``. The pause is the point of the attack
    (a watcher sees the file between the two writes), not a synchronisation."""
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(first)
        handle.flush()
        os.fsync(handle.fileno())
        time.sleep(pause)
        handle.write(second)


def swap_in_fifo(path: Path) -> None:
    """Replace the file at ``path`` by a FIFO (named pipe) with no writer, atomically."""
    tmp = path.with_name(f".{path.name}.fifo")
    os.mkfifo(tmp)
    os.replace(tmp, path)


async def config_validate(path: Path) -> tuple[int, str]:
    """``iop-edge config validate PATH`` as an operator runs it: its exit code and its output
    (stdout + stderr); a run that does not end within :data:`BOUND` is killed and fails."""
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("iop-edge")),
        "config",
        "validate",
        str(path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(BOUND):
            out, _ = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError(f"config validate {path} did not end within {BOUND} s") from None
    assert process.returncode is not None
    return process.returncode, out.decode(errors="replace")
