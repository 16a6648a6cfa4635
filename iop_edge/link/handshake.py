"""The link's handshake and limits: :class:`LinkLimits` (sent in ``WELCOME``), the typed
``HELLO``, ``WELCOME`` and ``REFUSED`` messages with their parsers, and the version check
(pure: the standard library).

A link opens with the node's ``HELLO`` (due within ``hello_timeout_ms`` of the upgrade); the
edge answers ``WELCOME`` (the node's id, the heartbeat, the limits) or ``REFUSED`` and closes.
Each side reads the other's ``protocol`` first: another version raises
:class:`ProtocolMismatch`, which names both versions, before any other field is looked at
(a later version's meta may differ); a missing or mistyped field is a
:class:`~iop_edge.link.protocol.LinkViolation`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from iop_edge.errors import IopEdgeError
from iop_edge.link.protocol import (
    HEADER,
    KIB,
    MIB,
    PROTOCOL_VERSION,
    LinkViolation,
    optional_field,
    require_field,
)

__all__ = [
    "MAX_STREAMS_CEILING",
    "REQUEST_OVERHEAD_BYTES",
    "STREAMS_HEADROOM",
    "Hello",
    "LinkLimits",
    "ProtocolMismatch",
    "Refused",
    "RefusedReason",
    "Welcome",
    "parse_hello",
    "parse_refused",
    "parse_welcome",
]


class ProtocolMismatch(IopEdgeError):
    """The peer speaks another link protocol version: refused with :data:`CLOSE_PROTOCOL`.

    ``edge_protocol`` and ``node_protocol`` are the two versions; the message names both and
    what to upgrade.
    """

    def __init__(self, *, edge_protocol: int, node_protocol: int, local: Literal["edge", "node"]):
        self.edge_protocol = edge_protocol
        self.node_protocol = node_protocol
        if local == "edge":
            message = (
                f"iop-node speaks link protocol {node_protocol}; this edge speaks "
                f"{edge_protocol}: upgrade the older of iop-edge and iop-node"
            )
        else:
            message = (
                f"the edge speaks link protocol {edge_protocol}; this iop-node speaks "
                f"{node_protocol}: upgrade the older of iop-edge and iop-node"
            )
        super().__init__(message)


REQUEST_OVERHEAD_BYTES: Final = 64 * KIB
"""``max_request_bytes`` = ``openai.max_body_bytes`` + this (the REQ's meta and framing)."""
STREAMS_HEADROOM: Final = 64
"""``max_streams`` = the node's capacity (unbounded routes count 256) + this: probes and
``count_tokens`` take no slot."""
MAX_STREAMS_CEILING: Final = 4096
"""``max_streams`` never exceeds this."""
_LIMIT_FIELDS: Final = (
    "max_frame_bytes",
    "window_bytes",
    "max_chunk_bytes",
    "max_reply_bytes",
    "max_request_bytes",
    "max_streams",
    "max_link_buffer_bytes",
    "max_pings_per_second",
    "hello_timeout_ms",
)


@dataclass(frozen=True, slots=True)
class LinkLimits:
    """The caps of one link, chosen by the edge and sent in ``WELCOME`` (both sides hold to
    them). Every field is a positive integer; :class:`ValueError` otherwise."""

    max_frame_bytes: int = 1 * MIB
    """One frame (one WebSocket message), header included; larger messages span frames."""
    window_bytes: int = 256 * KIB
    """A stream's initial credit: the response bytes the node may send before a ``WINDOW``."""
    max_chunk_bytes: int = 16 * MIB
    """One chunk message, and the data of ``RESP_STREAM``, ``RESP_END`` and ``RESP_ERROR``
    (a Responses ``response.completed`` event can be large)."""
    max_reply_bytes: int = 64 * MIB
    """One ``RESP_REPLY`` body."""
    max_request_bytes: int = 8 * MIB + REQUEST_OVERHEAD_BYTES
    """One ``REQ`` body: ``openai.max_body_bytes`` + :data:`REQUEST_OVERHEAD_BYTES` (the
    default is for the default ``max_body_bytes``)."""
    max_streams: int = 256 + STREAMS_HEADROOM
    """Request streams open at once (see :data:`STREAMS_HEADROOM`, at most
    :data:`MAX_STREAMS_CEILING`)."""
    max_link_buffer_bytes: int = 64 * MIB
    """What the edge holds for one link: message parts being assembled and chunks its
    consumers have not taken yet."""
    max_pings_per_second: int = 20
    """More ``PING`` frames in one second is a flood."""
    hello_timeout_ms: int = 10_000
    """``HELLO`` is due within this of the upgrade."""

    def __post_init__(self) -> None:
        for name in _LIMIT_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"LinkLimits.{name}: {value!r} is not a positive integer")
        if self.max_frame_bytes <= HEADER.size:
            raise ValueError(
                f"LinkLimits.max_frame_bytes: {self.max_frame_bytes} leaves no room after the "
                f"{HEADER.size}-byte header"
            )
        if self.max_streams > MAX_STREAMS_CEILING:
            raise ValueError(
                f"LinkLimits.max_streams: {self.max_streams} is over {MAX_STREAMS_CEILING}"
            )

    def to_meta(self) -> dict[str, int]:
        """The limits as ``WELCOME.limits``."""
        return {name: getattr(self, name) for name in _LIMIT_FIELDS}

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> LinkLimits:
        """The limits of a ``WELCOME.limits`` object: every field required, unknown ones
        ignored; ``missing_field`` / ``bad_field`` otherwise."""
        values = {name: require_field(meta, name, int, "WELCOME.limits") for name in _LIMIT_FIELDS}
        try:
            return cls(**values)
        except ValueError as exc:
            raise LinkViolation("bad_field", f"WELCOME.limits: {exc}") from None


@dataclass(frozen=True, slots=True)
class Hello:
    """A node's ``HELLO``: who it is and which payload generations it still holds."""

    protocol: int
    agent: str
    """The ``iop-node`` version."""
    hostname: str
    pid: int
    have: tuple[str, ...] = ()
    """Payload generations the node has built and still holds (the edge may then omit the
    payload from ``PAYLOAD``)."""

    def to_meta(self) -> dict[str, Any]:
        """The ``HELLO`` meta."""
        return {
            "protocol": self.protocol,
            "agent": self.agent,
            "hostname": self.hostname,
            "pid": self.pid,
            "have": list(self.have),
        }


@dataclass(frozen=True, slots=True)
class Welcome:
    """The edge's ``WELCOME``: the link is accepted for ``node_id``."""

    protocol: int
    edge_id: str
    edge_version: str
    node_id: str
    heartbeat_ms: int
    limits: LinkLimits

    def to_meta(self) -> dict[str, Any]:
        """The ``WELCOME`` meta."""
        return {
            "protocol": self.protocol,
            "edge_id": self.edge_id,
            "edge_version": self.edge_version,
            "node_id": self.node_id,
            "heartbeat_ms": self.heartbeat_ms,
            "limits": self.limits.to_meta(),
        }


RefusedReason = Literal["protocol", "superseded", "payload", "stopping"]
"""Why a side refused a link (``REFUSED.reason``)."""


@dataclass(frozen=True, slots=True)
class Refused:
    """A ``REFUSED`` (the sender closes next). ``reason`` is one of :data:`RefusedReason` from
    this version; a later one may send others, which a reader treats as passing."""

    reason: str
    message: str
    edge_protocol: int | None = None
    node_protocol: int | None = None

    def to_meta(self) -> dict[str, Any]:
        """The ``REFUSED`` meta."""
        meta: dict[str, Any] = {"reason": self.reason, "message": self.message}
        if self.edge_protocol is not None:
            meta["edge_protocol"] = self.edge_protocol
        if self.node_protocol is not None:
            meta["node_protocol"] = self.node_protocol
        return meta


def parse_hello(meta: Mapping[str, Any]) -> Hello:
    """A ``HELLO``'s fields. Its ``protocol`` is read first: another version raises
    :class:`ProtocolMismatch` (the rest of its meta may differ); a missing or mistyped field
    raises :class:`LinkViolation`."""
    protocol = require_field(meta, "protocol", int, "HELLO")
    if protocol != PROTOCOL_VERSION:
        raise ProtocolMismatch(edge_protocol=PROTOCOL_VERSION, node_protocol=protocol, local="edge")
    have = require_field(meta, "have", list, "HELLO")
    if not all(isinstance(g, str) for g in have):
        raise LinkViolation(
            "bad_field",
            "HELLO meta field 'have' holds a value that is not a string; it lists generations",
        )
    return Hello(
        protocol=protocol,
        agent=require_field(meta, "agent", str, "HELLO"),
        hostname=require_field(meta, "hostname", str, "HELLO"),
        pid=require_field(meta, "pid", int, "HELLO"),
        have=tuple(have),
    )


def parse_welcome(meta: Mapping[str, Any]) -> Welcome:
    """A ``WELCOME``'s fields, read by the node: another ``protocol`` raises
    :class:`ProtocolMismatch`, a missing or mistyped field :class:`LinkViolation`."""
    protocol = require_field(meta, "protocol", int, "WELCOME")
    if protocol != PROTOCOL_VERSION:
        raise ProtocolMismatch(edge_protocol=protocol, node_protocol=PROTOCOL_VERSION, local="node")
    heartbeat_ms = require_field(meta, "heartbeat_ms", int, "WELCOME")
    if heartbeat_ms <= 0:
        raise LinkViolation(
            "bad_field", f"WELCOME meta field 'heartbeat_ms' is {heartbeat_ms}; it must be >= 1"
        )
    return Welcome(
        protocol=protocol,
        edge_id=require_field(meta, "edge_id", str, "WELCOME"),
        edge_version=require_field(meta, "edge_version", str, "WELCOME"),
        node_id=require_field(meta, "node_id", str, "WELCOME"),
        heartbeat_ms=heartbeat_ms,
        limits=LinkLimits.from_meta(require_field(meta, "limits", dict, "WELCOME")),
    )


def parse_refused(meta: Mapping[str, Any]) -> Refused:
    """A ``REFUSED``'s fields (``reason`` and ``message`` required)."""
    return Refused(
        reason=require_field(meta, "reason", str, "REFUSED"),
        message=require_field(meta, "message", str, "REFUSED"),
        edge_protocol=optional_field(meta, "edge_protocol", int, "REFUSED"),
        node_protocol=optional_field(meta, "node_protocol", int, "REFUSED"),
    )
