"""The node link's wire format, version 1: frames and their kinds, flags, directions and close
codes (pure: the standard library and orjson; the limits and the handshake's messages are in
:mod:`iop_edge.link.handshake`).

A frame is one binary WebSocket message: a 10-byte header ``struct "!BBII"`` — ``kind`` u8,
``flags`` u8, ``stream`` u32, ``meta_len`` u32 —, then ``meta`` (an orjson object; empty when
``meta_len`` is 0), then ``data`` (the rest, raw bytes). Stream 0 is the link itself; the edge
opens request streams from 1 and never reuses an id within a link. :attr:`Flag.MORE` says the
message goes on in the next frame *of the same stream* (frames of other streams may come in
between): a request body, a reply body, a chunk or a final response larger than one frame. Its
meta is the first frame's; a later frame's meta is ignored.

The hot path — a streamed chunk — pays a ``struct`` pack and unpack and no JSON: its meta is
empty, and SSE frames, which are JSON text already, travel as raw data (no second escaping).

Everything a peer may get wrong raises :class:`LinkViolation`, whose ``reason`` is a short slug
(:data:`ViolationReason`) for logs and metrics, and whose message names the value and the rule.
Unknown meta keys are ignored (a later version may add some); unknown kinds and flags are not.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import IntEnum, IntFlag
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

import orjson

from iop_edge.errors import IopEdgeError

if TYPE_CHECKING:
    from iop_edge.link.handshake import LinkLimits

__all__ = [
    "CLOSE_DEAD",
    "CLOSE_GOING_AWAY",
    "CLOSE_NORMAL",
    "CLOSE_PAYLOAD",
    "CLOSE_PROTOCOL",
    "CLOSE_SUPERSEDED",
    "CLOSE_TOO_BIG",
    "CLOSE_VIOLATION",
    "CONTINUABLE",
    "FROM_EDGE",
    "FROM_NODE",
    "HEADER",
    "KIB",
    "LINK_KINDS",
    "MIB",
    "PROTOCOL_VERSION",
    "TERMINAL",
    "Flag",
    "Frame",
    "Kind",
    "LinkViolation",
    "ViolationReason",
    "check_direction",
    "decode",
    "encode",
    "optional_field",
    "ping_data",
    "ping_ns",
    "require_field",
    "split",
    "window_data",
    "window_increment",
]

PROTOCOL_VERSION: Final = 1
"""The link protocol this code speaks (``HELLO.protocol``, ``WELCOME.protocol``)."""

HEADER: Final = struct.Struct("!BBII")
"""``kind`` u8, ``flags`` u8, ``stream`` u32, ``meta_len`` u32: 10 bytes, network order."""
_HEADER_BYTES: Final = HEADER.size
KIB: Final = 1024
MIB: Final = 1024 * KIB
_U32: Final = struct.Struct("!I")
_U64: Final = struct.Struct("!Q")

# WebSocket close codes. 1000/1001/1009 are RFC 6455's; the 4xxx ones are the link's own
# (private range), echoing the HTTP status they resemble where one fits.
CLOSE_NORMAL: Final = 1000
"""A clean close (the edge stops after its links went idle)."""
CLOSE_GOING_AWAY: Final = 1001
"""The process is stopping (``node_links.close()``)."""
CLOSE_TOO_BIG: Final = 1009
"""A WebSocket message over ``max_frame_bytes`` (aiohttp closes with it by itself)."""
CLOSE_VIOLATION: Final = 4400
"""The peer broke the protocol (the close reason is the :data:`ViolationReason`)."""
CLOSE_PROTOCOL: Final = 4002
"""The peers speak different protocol versions (after ``REFUSED{protocol}``)."""
CLOSE_SUPERSEDED: Final = 4003
"""A newer link of the same node replaced this one (after ``REFUSED{superseded}``)."""
CLOSE_PAYLOAD: Final = 4004
"""The node could not build the payload it was sent (``ACK{error}``)."""
CLOSE_DEAD: Final = 4408
"""Nothing arrived for 3 heartbeats: the link is declared dead."""


class Kind(IntEnum):
    """What a frame carries (its first byte)."""

    HELLO = 0x01
    WELCOME = 0x02
    REFUSED = 0x03
    PAYLOAD = 0x04
    ACK = 0x05
    PING = 0x06
    PONG = 0x07
    GOAWAY = 0x08
    STATS = 0x09
    REQ = 0x10
    CANCEL = 0x11
    WINDOW = 0x12
    PROBE = 0x13
    RESP_REPLY = 0x20
    RESP_STREAM = 0x21
    RESP_CHUNK = 0x22
    PROBE_RESULT = 0x23
    RESP_END = 0x24
    RESP_ERROR = 0x25


class Flag(IntFlag):
    """A frame's flag bits (its second byte)."""

    MORE = 0x01
    """The message continues in the next frame of the same stream."""


_KINDS: Final[dict[int, Kind]] = {int(k): k for k in Kind}
# Pre-built: Flag(0) and Flag(1) are looked up per frame otherwise.
_FLAGS: Final[tuple[Flag, Flag]] = (Flag(0), Flag.MORE)
_NO_FLAGS: Final = _FLAGS[0]

FROM_NODE: Final[frozenset[Kind]] = frozenset(
    {
        Kind.HELLO,
        Kind.ACK,
        Kind.STATS,
        Kind.PROBE_RESULT,
        Kind.RESP_REPLY,
        Kind.RESP_STREAM,
        Kind.RESP_CHUNK,
        Kind.RESP_END,
        Kind.RESP_ERROR,
    }
)
"""The kinds only a node sends."""
FROM_EDGE: Final[frozenset[Kind]] = frozenset(
    {Kind.WELCOME, Kind.PAYLOAD, Kind.REQ, Kind.CANCEL, Kind.WINDOW, Kind.PROBE}
)
"""The kinds only the edge sends (``REFUSED``, ``PING``, ``PONG``, ``GOAWAY``: either side)."""
LINK_KINDS: Final[frozenset[Kind]] = frozenset(
    {
        Kind.HELLO,
        Kind.WELCOME,
        Kind.REFUSED,
        Kind.PAYLOAD,
        Kind.ACK,
        Kind.PING,
        Kind.PONG,
        Kind.GOAWAY,
        Kind.STATS,
    }
)
"""The kinds that travel on stream 0 (every other kind needs a request stream, id >= 1)."""
CONTINUABLE: Final[frozenset[Kind]] = frozenset(
    {
        Kind.REQ,
        Kind.RESP_REPLY,
        Kind.RESP_STREAM,
        Kind.RESP_CHUNK,
        Kind.RESP_END,
        Kind.RESP_ERROR,
    }
)
"""The kinds whose data may span frames (:attr:`Flag.MORE`)."""
TERMINAL: Final[frozenset[Kind]] = frozenset(
    {Kind.RESP_REPLY, Kind.RESP_END, Kind.RESP_ERROR, Kind.PROBE_RESULT}
)
"""The kinds that end a request stream once their message is complete."""

ViolationReason = Literal[
    "short_header",
    "meta_length",
    "meta_not_object",
    "unknown_kind",
    "unknown_flag",
    "misplaced_flag",
    "stream_id",
    "wrong_direction",
    "phase",
    "missing_field",
    "bad_field",
    "frame_too_large",
    "message_too_large",
    "unknown_stream",
    "closed_stream",
    "stream_reused",
    "too_many_streams",
    "over_credit",
    "buffer_full",
    "ping_flood",
    "text_message",
]
"""Why a link was closed as a violation (the close reason, a log field, a metric label).

``short_header``, ``meta_length``, ``meta_not_object``, ``unknown_kind``, ``unknown_flag``,
``misplaced_flag`` (``MORE`` on a kind that cannot continue), ``stream_id`` (a link kind off
stream 0 or a request kind on it) and ``frame_too_large``: a frame that does not decode.
``wrong_direction`` (a kind the sender may not send), ``phase`` (a kind out of turn: a second
``HELLO``, a chunk before the stream's head, a continuation of another kind), ``missing_field``
and ``bad_field`` (meta lacks a required field or has one of the wrong type or value);
``message_too_large`` (over its cap), ``unknown_stream`` (never opened), ``closed_stream``
(already ended), ``stream_reused``, ``too_many_streams``, ``over_credit`` (a chunk begun without
credit), ``buffer_full`` (the link's buffer cap), ``ping_flood``, ``text_message``."""


class LinkViolation(IopEdgeError):
    """The peer broke the link protocol: the link is closed (:data:`CLOSE_VIOLATION`).

    ``reason`` is the slug (:data:`ViolationReason`); the message a sentence naming the value
    and the rule.
    """

    def __init__(self, reason: ViolationReason, message: str) -> None:
        self.reason: ViolationReason = reason
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame: its kind, flags, stream id, meta (a JSON object) and raw data.

    A complete message is a frame too (what :class:`iop_edge.link.flow.StreamTable` hands
    on): its meta the first frame's, its data every frame's joined, ``MORE`` clear.
    """

    kind: Kind
    flags: Flag = _NO_FLAGS
    stream: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    data: bytes = b""

    @property
    def more(self) -> bool:
        """Whether the message continues in the next frame of this stream."""
        return bool(self.flags & Flag.MORE)


def encode(frame: Frame) -> bytes:
    """The bytes of ``frame`` on the wire (one WebSocket binary message); an empty meta is
    written as ``meta_len`` 0, with no JSON."""
    meta = orjson.dumps(frame.meta) if frame.meta else b""
    return b"".join(
        (HEADER.pack(frame.kind, frame.flags, frame.stream, len(meta)), meta, frame.data)
    )


def decode(raw: bytes, limits: LinkLimits) -> Frame:
    """The frame in one WebSocket binary message; :class:`LinkViolation` for anything
    malformed: a short header, a meta length beyond the frame, meta that is not a JSON object,
    an unknown kind or flag, ``MORE`` on a kind that cannot continue, a kind on the wrong
    stream, or a frame over ``limits.max_frame_bytes``."""
    size = len(raw)
    if size < _HEADER_BYTES:
        raise LinkViolation(
            "short_header",
            f"a frame of {size} bytes is shorter than the {_HEADER_BYTES}-byte frame header",
        )
    if size > limits.max_frame_bytes:
        raise LinkViolation(
            "frame_too_large",
            f"a frame of {size} bytes is over max_frame_bytes ({limits.max_frame_bytes})",
        )
    kind_byte, flag_byte, stream, meta_len = HEADER.unpack_from(raw)
    kind = _KINDS.get(kind_byte)
    if kind is None:
        raise LinkViolation("unknown_kind", f"frame kind 0x{kind_byte:02x} is not a known kind")
    if flag_byte > 1:
        raise LinkViolation(
            "unknown_flag",
            f"a {kind.name} frame has flags 0x{flag_byte:02x}; only MORE (0x01) is defined",
        )
    if flag_byte and kind not in CONTINUABLE:
        raise LinkViolation(
            "misplaced_flag", f"a {kind.name} frame has MORE set; a {kind.name} cannot continue"
        )
    if (stream == 0) != (kind in LINK_KINDS):
        rule = "stream 0" if kind in LINK_KINDS else "a request stream (id >= 1)"
        raise LinkViolation(
            "stream_id", f"a {kind.name} frame on stream {stream}; a {kind.name} travels on {rule}"
        )
    end = _HEADER_BYTES + meta_len
    if end > size:
        raise LinkViolation(
            "meta_length",
            f"a {kind.name} frame of {size} bytes declares {meta_len} bytes of meta, beyond "
            f"its end",
        )
    if meta_len == 0:
        return Frame(kind, _FLAGS[flag_byte], stream, {}, raw[_HEADER_BYTES:])
    try:
        meta = orjson.loads(raw[_HEADER_BYTES:end])
    except orjson.JSONDecodeError as exc:
        raise LinkViolation(
            "meta_not_object", f"a {kind.name} frame's meta is not valid JSON ({exc})"
        ) from None
    if not isinstance(meta, dict):
        raise LinkViolation(
            "meta_not_object",
            f"a {kind.name} frame's meta is a JSON {type(meta).__name__}, not an object",
        )
    return Frame(kind, _FLAGS[flag_byte], stream, meta, raw[end:])


def split(
    kind: Kind, stream: int, meta: dict[str, Any], data: bytes, max_frame_bytes: int
) -> Iterator[Frame]:
    """The frames of one message: ``meta`` in the first, ``data`` cut so that each frame
    encodes to at most ``max_frame_bytes``, ``MORE`` on every frame but the last. One frame
    (the hot path) when it fits; :class:`ValueError` when even the meta does not fit."""
    meta_bytes = len(orjson.dumps(meta)) if meta else 0
    room = max_frame_bytes - _HEADER_BYTES - meta_bytes
    if room <= 0:
        raise ValueError(
            f"a {kind.name} meta of {meta_bytes} bytes does not fit in max_frame_bytes "
            f"({max_frame_bytes})"
        )
    if len(data) <= room:
        yield Frame(kind, _NO_FLAGS, stream, meta, data)
        return
    if kind not in CONTINUABLE:
        raise ValueError(f"a {kind.name} of {len(data)} bytes of data cannot span frames")
    view = memoryview(data)
    yield Frame(kind, Flag.MORE, stream, meta, bytes(view[:room]))
    offset, room = room, max_frame_bytes - _HEADER_BYTES
    while offset < len(data):
        end = offset + room
        flags = Flag.MORE if end < len(data) else _NO_FLAGS
        yield Frame(kind, flags, stream, {}, bytes(view[offset:end]))
        offset = end


def check_direction(kind: Kind, *, from_node: bool) -> None:
    """Raise :class:`LinkViolation` (``wrong_direction``) when ``kind`` may not travel from
    its sender: a node sends ``HELLO``, ``ACK``, ``STATS``, ``PROBE_RESULT`` and the
    responses; the edge ``WELCOME``, ``PAYLOAD``, ``REQ``, ``CANCEL``, ``WINDOW``, ``PROBE``;
    either ``REFUSED``, ``PING``, ``PONG``, ``GOAWAY``."""
    if kind in (FROM_EDGE if from_node else FROM_NODE):
        sender, receiver = ("a node", "the edge") if from_node else ("the edge", "a node")
        raise LinkViolation(
            "wrong_direction", f"{sender} sent {kind.name}, which only {receiver} may send"
        )


def ping_data(now_ns: int) -> bytes:
    """A ``PING``'s data: the sender's monotonic time in ns, 8 bytes (echoed by ``PONG``)."""
    return _U64.pack(now_ns)


def ping_ns(frame: Frame) -> int:
    """The monotonic ns a ``PING`` or ``PONG`` carries; ``bad_field`` unless 8 bytes."""
    if len(frame.data) != _U64.size:
        raise LinkViolation(
            "bad_field",
            f"a {frame.kind.name} carries {len(frame.data)} bytes of data; it must carry the "
            f"8-byte monotonic ns",
        )
    ns: int = _U64.unpack(frame.data)[0]
    return ns


def window_data(increment: int) -> bytes:
    """A ``WINDOW``'s data: the credit increment in bytes, a u32 (1 .. 2**32 - 1)."""
    return _U32.pack(increment)


def window_increment(frame: Frame) -> int:
    """The credit a ``WINDOW`` grants; ``bad_field`` unless a positive u32."""
    if len(frame.data) != _U32.size:
        raise LinkViolation(
            "bad_field",
            f"a WINDOW on stream {frame.stream} carries {len(frame.data)} bytes; it must carry "
            f"a 4-byte credit increment",
        )
    increment: int = _U32.unpack(frame.data)[0]
    if increment == 0:
        raise LinkViolation(
            "bad_field", f"a WINDOW on stream {frame.stream} grants 0 bytes; it must grant >= 1"
        )
    return increment


_T = TypeVar("_T")


def require_field(meta: Mapping[str, Any], name: str, kind: type[_T], where: str) -> _T:
    """``meta[name]``, which must be a ``kind`` (an ``int`` is never a ``bool``, a ``float``
    may be an ``int``); ``missing_field`` or ``bad_field`` naming ``where`` (``"HELLO"``)."""
    if name not in meta:
        raise LinkViolation("missing_field", f"{where} meta lacks the required field {name!r}")
    return _typed(meta[name], name, kind, where)


def optional_field(meta: Mapping[str, Any], name: str, kind: type[_T], where: str) -> _T | None:
    """``meta[name]`` when present and not ``null`` (then it must be a ``kind``), else
    ``None``."""
    value = meta.get(name)
    return None if value is None else _typed(value, name, kind, where)


def _typed(value: Any, name: str, kind: type[_T], where: str) -> _T:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)  # type: ignore[return-value]  # (kind is float here)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise LinkViolation(
            "bad_field",
            f"{where} meta field {name!r} is {_show(value)}; it must be {_json_type(kind)}",
        )
    return value


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _json_type(kind: type) -> str:
    return {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "a boolean",
        list: "a list",
        dict: "an object",
    }.get(kind, f"a {kind.__name__}")
