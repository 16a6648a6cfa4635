"""A daemon's remote node for the visibility tests (status, metrics, the dashboard): a config
with one remote node (:func:`with_remote_node`) and a scripted node that dials it, handshakes
and answers the edge's ``PING`` (:class:`AnsweringNode`), so the link stays up and its round
trip is measured, while the test reads every other frame the edge sends."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Final

from iop_edge.daemon import Daemon
from iop_edge.link.protocol import Frame, Kind
from iop_edge.testing.hostile_node import ScriptedNode
from iop_edge.testing.leaks import wait_for
from iop_edge.tokens import token_hash
from tests.helpers.links import TOKENS

REMOTE_NODE: Final = "n2"
"""The remote node :func:`with_remote_node` adds (its token is ``TOKENS["n2"]``; ``n1`` is
left to the configs it is added to)."""
REMOTE_PROVIDER: Final = "far"
REMOTE_MODEL: Final = "far-chat"
HEARTBEAT_MS: Final = 500
"""Short enough that the first round trip is measured soon; long enough that a busy machine
does not let the link go silent for three heartbeats."""


def with_remote_node(doc: dict[str, Any], base_url: str = "http://10.0.0.9/v1") -> dict[str, Any]:
    """``doc`` with the node listener on 127.0.0.1 (port 0) and remote node ``n2``: provider
    ``far`` (an ``openai_compat`` adapter at ``base_url``, which only the node would call)
    serving model ``far-chat`` alone."""
    doc = {**doc, "nodes": list(doc["nodes"]), "models": list(doc["models"])}
    doc["listen"] = {"address": "127.0.0.1:0"}
    doc["bootstrap"] = {"heartbeat_ms": HEARTBEAT_MS}
    doc["nodes"].append(
        {
            "id": REMOTE_NODE,
            "token_hash_sha256": token_hash(TOKENS[REMOTE_NODE]),
            "adapters": [{"name": "oa", "type": "openai_compat", "base_url": base_url}],
            "providers": [
                {
                    "id": REMOTE_PROVIDER,
                    "type": "openai_compat",
                    "category": "api",
                    "adapter": "oa",
                    "models": ["far-model"],
                }
            ],
        }
    )
    doc["models"].append(
        {"id": REMOTE_MODEL, "context_window_tokens": 4096, "providers": [REMOTE_PROVIDER]}
    )
    return doc


class AnsweringNode:
    """A :class:`ScriptedNode` whose ``PING``s are answered by a reader task; every other
    frame of the edge waits in :meth:`next_frame`."""

    def __init__(self, node: ScriptedNode) -> None:
        self.node = node
        self.frames: asyncio.Queue[Frame | None] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while (frame := await self.node.receive(skip=())) is not None:
            if frame.kind is Kind.PING:
                await self.node.send(Frame(Kind.PONG, data=frame.data))
            else:
                self.frames.put_nowait(frame)
        self.frames.put_nowait(None)

    async def next_frame(self) -> Frame | None:
        """The edge's next frame other than ``PING`` (``None`` once the link closed)."""
        return await asyncio.wait_for(self.frames.get(), timeout=15)

    async def close(self) -> None:
        """Close the link (the edge sees the node go) and stop reading."""
        await self.node.close()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


def link_url(daemon: Daemon) -> str:
    """The daemon's ``GET /link``."""
    return daemon.listeners["nodes"].url + "/link"


def node_connected(daemon: Daemon, node_id: str = REMOTE_NODE) -> bool:
    """Whether ``node_id``'s link is up, as the daemon's statistics say."""
    return next(n.connected for n in daemon.node_statistics() if n.node_id == node_id)


@contextlib.asynccontextmanager
async def answering_node(daemon: Daemon) -> AsyncIterator[AnsweringNode]:
    """Node ``n2`` dialled into ``daemon``, its payload acknowledged and the daemon seeing it
    connected; its link closed afterwards."""
    scripted = await ScriptedNode.dial(link_url(daemon), TOKENS[REMOTE_NODE])
    try:
        await scripted.handshake()
    except BaseException:
        await scripted.close()
        raise
    node = AnsweringNode(scripted)
    try:
        await wait_for(lambda: node_connected(daemon))
        yield node
    finally:
        await node.close()
