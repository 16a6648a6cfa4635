"""A frozen snapshot of one node's link, read by the status API and the metrics (pure).

The edge's :class:`~iop_edge.link.remote.RemoteNode` builds one per node at call time (kept
nowhere: the counters live in the link objects, so no count is kept twice); a local node's
snapshot says ``remote=False`` and ``connected=True``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NodeLinkStatistics"]


@dataclass(frozen=True, slots=True)
class NodeLinkStatistics:
    """One node's link as of now. Times are the edge's monotonic seconds; ``None`` where
    nothing is known yet (never connected, no round trip measured).

    ``connected``: a link is up and its payload generation acknowledged. ``peer``: the node's
    address as the edge sees it (``host:port``). ``agent_version`` and ``protocol``: from the
    node's ``HELLO``. ``generation``: the payload generation the edge sends this node;
    ``generation_acked``: the one the node acknowledged on its current link. ``in_flight``:
    request streams open on the current link. ``reconnects``: links acknowledged after the
    first, in this process. ``rtt``: the ``PING`` round trip in seconds (an exponentially
    weighted average). ``bytes_sent`` / ``bytes_received``: frame bytes over every link of
    this process. ``last_down_at`` / ``last_down_reason``: when and why the last link went
    down (``heartbeat``, ``violation``, ``superseded``, ``node_closed``, ``handover``,
    ``stopping``). ``violations``: links closed for a protocol violation.
    """

    node_id: str
    remote: bool
    connected: bool
    connected_since: float | None = None
    peer: str | None = None
    agent_version: str | None = None
    protocol: int | None = None
    generation: str | None = None
    generation_acked: str | None = None
    in_flight: int = 0
    reconnects: int = 0
    rtt: float | None = None
    bytes_sent: int = 0
    bytes_received: int = 0
    last_down_at: float | None = None
    last_down_reason: str | None = None
    violations: int = 0
