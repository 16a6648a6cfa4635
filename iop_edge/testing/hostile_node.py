"""A node link's client end driven frame by frame, for the edge's tests: a well-behaved node
(:meth:`ScriptedNode.handshake`, then answers written by hand) or a hostile one (garbage, huge
frames, forged ids, data beyond credit, floods).

:meth:`ScriptedNode.dial` upgrades ``GET /link`` with a bearer token and keeps the raw
WebSocket: :meth:`~ScriptedNode.send` encodes a frame, :meth:`~ScriptedNode.send_raw` sends any
bytes, :meth:`~ScriptedNode.receive` decodes the edge's next frame (``None`` once the edge
closed; :attr:`~ScriptedNode.close_code` and :attr:`~ScriptedNode.close_reason` say how). It
answers nothing by itself (not even ``PING``), so a test sees every frame the edge sends.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping
from typing import Any

import aiohttp

from iop_edge.link.connection import client_options
from iop_edge.link.handshake import LinkLimits
from iop_edge.link.protocol import PROTOCOL_VERSION, Frame, Kind, decode, encode

__all__ = ["DialRefused", "ScriptedNode"]

_ANY_SIZE = LinkLimits(max_frame_bytes=64 * 1024 * 1024, max_chunk_bytes=64 * 1024 * 1024)


class DialRefused(Exception):
    """The edge answered the upgrade with an HTTP error: ``status`` and the JSON ``body``."""

    def __init__(self, status: int, body: Any, headers: Mapping[str, str]) -> None:
        self.status = status
        self.body = body
        self.headers = dict(headers)
        super().__init__(f"the edge answered HTTP {status}: {body}")


class ScriptedNode:
    """One link dialled to an edge, every frame by hand (see the module docstring)."""

    def __init__(self, session: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse):
        self.session = session
        self.ws = ws
        self.close_code: int | None = None
        self.close_reason = ""

    @classmethod
    async def dial(
        cls,
        url: str,
        token: str | None,
        *,
        ssl: Any = True,
        max_msg_size: int = 0,
    ) -> ScriptedNode:
        """Upgrade ``url`` (``http://host:port/link``) with ``token``;
        :class:`DialRefused` when the edge answers an HTTP error instead."""
        session = aiohttp.ClientSession()
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        options = client_options(LinkLimits())
        options["max_msg_size"] = max_msg_size
        try:
            ws = await session.ws_connect(url, headers=headers, ssl=ssl, **options)
        except aiohttp.WSServerHandshakeError as exc:
            await session.close()
            raise DialRefused(exc.status, exc.message, exc.headers or {}) from None
        except BaseException:
            await session.close()
            raise
        return cls(session, ws)

    async def send(self, frame: Frame) -> None:
        """Send one frame as it is (nothing is checked)."""
        await self.ws.send_bytes(encode(frame))

    async def send_raw(self, data: bytes) -> None:
        """Send any bytes as one binary message."""
        await self.ws.send_bytes(data)

    async def send_text(self, text: str) -> None:
        """Send a text message (which the link never carries)."""
        await self.ws.send_str(text)

    async def receive(self, *, skip: Iterable[Kind] = (Kind.PING,)) -> Frame | None:
        """The edge's next frame, those of a kind in ``skip`` passed over; ``None`` once the
        link is closed."""
        skipped = frozenset(skip)
        while True:
            msg = await self.ws.receive()
            if msg.type is aiohttp.WSMsgType.BINARY:
                frame = decode(msg.data, _ANY_SIZE)
                if frame.kind in skipped:
                    continue
                return frame
            if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING):
                self.close_code = self.ws.close_code if msg.data is None else int(msg.data)
                self.close_reason = msg.extra or ""
                continue
            if msg.type is aiohttp.WSMsgType.CLOSED:
                if self.close_code is None:
                    self.close_code = self.ws.close_code
                return None
            if msg.type is aiohttp.WSMsgType.ERROR:
                return None

    async def expect(self, kind: Kind) -> Frame:
        """The next frame, which must be of ``kind`` (:class:`AssertionError` naming what came
        otherwise)."""
        frame = await self.receive()
        if frame is None or frame.kind is not kind:
            got = "the close" if frame is None else f"{frame.kind.name} {frame.meta}"
            raise AssertionError(
                f"expected {kind.name}, got {got} (close {self.close_code} {self.close_reason!r})"
            )
        return frame

    async def hello(
        self, *, protocol: int = PROTOCOL_VERSION, have: Iterable[str] = (), agent: str = "test"
    ) -> None:
        """Send a ``HELLO``."""
        meta = {
            "protocol": protocol,
            "agent": agent,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "have": list(have),
        }
        await self.send(Frame(Kind.HELLO, meta=meta))

    async def handshake(self, *, have: Iterable[str] = ()) -> tuple[Frame, Frame]:
        """``HELLO`` → ``WELCOME``, ``PAYLOAD`` → ``ACK``: the edge's two frames."""
        await self.hello(have=have)
        welcome = await self.expect(Kind.WELCOME)
        payload = await self.expect(Kind.PAYLOAD)
        await self.send(Frame(Kind.ACK, meta={"generation": payload.meta["generation"]}))
        return welcome, payload

    async def closed(self) -> tuple[int | None, str]:
        """Read until the edge closes the link; its close code and reason."""
        while await self.receive(skip=tuple(Kind)) is not None:
            pass
        return self.close_code, self.close_reason

    async def close(self) -> None:
        """Close the link and the client session."""
        await self.ws.close()
        await self.session.close()
