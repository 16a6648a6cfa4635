"""The upstream adapters (SPEC §7): ``openai_compat`` passthrough, ``ollama`` and ``cli``
normalized, all built from a node's :class:`~iop_edge.config.payload.NodeConfigPayload`.

The seam the HTTP layer uses is in :mod:`iop_edge.adapters.base` (the types) and
:mod:`iop_edge.adapters.registry` (the builders), re-exported here::

    adapters = AdapterSet.from_payload(node_payload(config, "gpu-1"))
    executor = adapters.for_provider("vllm-a")
    result = await executor.open_stream(call)       # UpstreamStream | UpstreamReply
    ...
    await adapters.aclose()
"""

from iop_edge.adapters.base import (
    DEFAULT_REQUEST_TIMEOUT_MS,
    Endpoint,
    Executor,
    StreamBounds,
    UnsupportedRequestError,
    UpstreamCall,
    UpstreamReply,
    UpstreamStream,
    Usage,
)
from iop_edge.adapters.registry import AdapterSet, NodeAdapters

__all__ = [
    "DEFAULT_REQUEST_TIMEOUT_MS",
    "AdapterSet",
    "Endpoint",
    "Executor",
    "NodeAdapters",
    "StreamBounds",
    "UnsupportedRequestError",
    "UpstreamCall",
    "UpstreamReply",
    "UpstreamStream",
    "Usage",
]
