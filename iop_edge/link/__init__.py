"""The node link: one WebSocket per remote node, dialled by ``iop-node`` to the edge's node
listener, carrying many requests at once (docs/nodes.md has the protocol's tables).

A remote node's providers run on the node, with the same adapters as a local node's; the edge
keeps admission, and sees the node as one more :class:`~iop_edge.adapters.base.ExecutorSet`.
Both programs use this package; it knows nothing of admission or the HTTP surfaces.

- :mod:`.protocol` (pure): frames — a 10-byte header, JSON meta, raw data —, their kinds,
  flags and directions, the close codes, :class:`~.protocol.LinkViolation`;
- :mod:`.handshake` (pure): :class:`~.handshake.LinkLimits` and the ``HELLO`` / ``WELCOME`` /
  ``REFUSED`` messages with the version check;
- :mod:`.flow` (pure, sans-IO): the edge's :class:`~.flow.StreamTable` (open streams, what
  each may receive, credit to grant, the link's buffer) and the node's
  :class:`~.flow.SendCredit`;
- :mod:`.calls`: the adapter seam's calls, replies, usage and errors as frame meta, there and
  back;
- :mod:`.connection`: :class:`~.connection.LinkConnection`, one end of a link over an aiohttp
  WebSocket: frames, heartbeats on the injected clock, death detection, byte counters;
- :mod:`.statistics` (pure): :class:`~.statistics.NodeLinkStatistics`, a node's link as the
  status API and the metrics read it.

This ``__init__`` imports nothing, so that a pure module loads without aiohttp.
"""
