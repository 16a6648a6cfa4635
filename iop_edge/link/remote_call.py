"""One request stream of a remote call on the edge (:class:`RemoteCall`): awaiting its head,
streaming, done — the state :class:`iop_edge.link.remote.RemoteExecutor` waits on and the
link's reader feeds.

Frames of the node arrive through :meth:`RemoteCall.deliver` (complete messages, already
admitted by the link's :class:`~iop_edge.link.flow.StreamTable`), the loss of the link through
:meth:`RemoteCall.lose`; the caller's task waits in :meth:`RemoteCall.head` and
:meth:`RemoteCall.wait`. No lock: one loop, and each call has one consumer.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING

from iop_edge.link.protocol import Frame, Kind, window_data

if TYPE_CHECKING:
    from iop_edge.link.remote import Session

__all__ = ["RemoteCall"]


class RemoteCall:
    """One request stream on a link (see the module docstring). ``sent``: the whole request
    reached the transport (rule K of a lost link); ``lost``: why the link went, if it did."""

    __slots__ = (
        "_waiter",
        "chunks",
        "ended",
        "head_frame",
        "lost",
        "sent",
        "session",
        "stream",
        "terminal",
    )

    def __init__(self, session: Session, stream: int) -> None:
        self.session = session
        self.stream = stream
        self.sent = False
        self.head_frame: Frame | None = None
        self.chunks: deque[bytes] = deque()
        self.terminal: Frame | None = None
        self.lost: str | None = None
        #: resolved once the node's terminal message came or the link was lost
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiter: asyncio.Future[None] | None = None

    # -- from the link's reader ------------------------------------------------------------------

    def deliver(self, message: Frame) -> None:
        """A complete message of this stream."""
        if self.head_frame is None:
            self.head_frame = message
            if message.kind is not Kind.RESP_STREAM:
                self.terminal = message
        elif message.kind is Kind.RESP_CHUNK:
            self.chunks.append(message.data)
        else:
            self.terminal = message
        if self.terminal is not None:
            self._end()
        self._wake()

    def lose(self, reason: str) -> None:
        """The link is gone: whoever waits raises (its terminal message, if it came, stays
        the answer)."""
        if self.terminal is not None or self.lost is not None:
            return
        self.lost = reason
        self._end()
        self._wake()

    def _end(self) -> None:
        self.session.calls.pop(self.stream, None)
        if not self.ended.done():
            self.ended.set_result(None)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- from the caller's task --------------------------------------------------------------------

    async def wait(self) -> None:
        """Until the next message or the loss of the link."""
        self._waiter = waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    async def head(self) -> Frame:
        """The first message of the answer; the lost-link error (rule K) before it."""
        while self.head_frame is None:
            if self.lost is not None:
                raise self.session.node.lost_before_head(self.lost, sent=self.sent)
            await self.wait()
        return self.head_frame

    def take(self) -> bytes:
        """Every chunk buffered so far, joined (one write for the consumer)."""
        chunks = self.chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        return data

    async def consumed(self, nbytes: int) -> None:
        """The consumer took ``nbytes`` of chunks (its write returned): grant credit when
        due."""
        if self.lost is not None:
            return
        grant = self.session.table.consumed(self.stream, nbytes)
        if grant:
            await self.session.send_quietly(
                Frame(Kind.WINDOW, stream=self.stream, data=window_data(grant))
            )

    async def cancel(self) -> None:
        """Abandon the stream: ``CANCEL`` the node's task and wait, bounded, for its terminal
        frame (the upstream call really ended). Returns at once for a call that ended."""
        if self.ended.done():
            return
        session = self.session
        if session.table.cancel(self.stream):
            await session.send_quietly(Frame(Kind.CANCEL, stream=self.stream))
        node = session.node
        if not await node.within_cancel_grace(self.ended):
            node.log.warning(
                "node_cancel_unacked",
                node=node.node_id,
                stream=self.stream,
                message="the node did not confirm the end of a cancelled call within the CLI "
                "kill grace and three heartbeats; its slot is released anyway",
            )
