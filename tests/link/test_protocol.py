"""The link's wire format (issue 29, design §2): frames survive ``encode`` → ``decode``; any
bytes decode to a frame or a ``LinkViolation`` and nothing else; each malformed input is refused
with its own reason; a message is split under the frame cap; kinds keep to their direction."""

from __future__ import annotations

import struct
from typing import Any, get_args

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from iop_edge.link.handshake import LinkLimits
from iop_edge.link.protocol import (
    CONTINUABLE,
    FROM_EDGE,
    FROM_NODE,
    LINK_KINDS,
    Flag,
    Frame,
    Kind,
    LinkViolation,
    ViolationReason,
    check_direction,
    decode,
    encode,
    ping_data,
    ping_ns,
    split,
    window_data,
    window_increment,
)

LIMITS = LinkLimits()
REASONS = set(get_args(ViolationReason))

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
metas = st.dictionaries(st.text(max_size=12), json_values, max_size=5)


@st.composite
def frames(draw: st.DrawFn) -> Frame:
    """A well-formed frame of any kind: a stream that fits its kind, MORE only where it may be."""
    kind = draw(st.sampled_from(list(Kind)))
    stream = 0 if kind in LINK_KINDS else draw(st.integers(1, 2**32 - 1))
    more = kind in CONTINUABLE and draw(st.booleans())
    return Frame(
        kind,
        Flag.MORE if more else Flag(0),
        stream,
        draw(metas),
        draw(st.binary(max_size=300)),
    )


def decode_or_violation(raw: bytes) -> Frame | LinkViolation:
    """What ``decode`` makes of ``raw``: a frame, or the violation it raised (any other
    exception propagates and fails the test)."""
    try:
        return decode(raw, LIMITS)
    except LinkViolation as exc:
        return exc


def header(kind: int, flags: int = 0, stream: int = 0, meta_len: int = 0) -> bytes:
    return struct.pack("!BBII", kind, flags, stream, meta_len)


@given(frames())
def test_every_frame_survives_encode_and_decode(frame):
    assert decode(encode(frame), LIMITS) == frame


@given(st.binary(max_size=64))
def test_any_bytes_decode_to_a_frame_or_a_violation(raw):
    frame = decode_or_violation(raw)
    if isinstance(frame, LinkViolation):
        assert frame.reason in REASONS
        return
    assert isinstance(frame, Frame)
    if raw[6:10] == b"\0\0\0\0":  # (no meta: nothing spelled another way on the way back)
        assert encode(frame) == raw


@given(
    st.integers(0, 255),
    st.integers(0, 255),
    st.integers(0, 2**32 - 1),
    st.integers(0, 80),
    st.binary(max_size=80) | metas.map(orjson.dumps),
)
def test_plausible_headers_decode_to_a_frame_or_a_violation(kind, flags, stream, meta_len, tail):
    """Arbitrary bytes rarely get past the header: these do, with any kind, flags, stream and
    meta length before any tail."""
    raw = header(kind, flags, stream, meta_len) + tail
    frame = decode_or_violation(raw)
    if isinstance(frame, LinkViolation):
        assert frame.reason in REASONS
        return
    assert frame.kind == kind
    assert frame.stream == stream
    assert isinstance(frame.meta, dict)
    assert frame.data == raw[10 + meta_len :]


def test_a_chunk_pays_the_header_and_no_json():
    """The hot path: a chunk is 10 header bytes and its data, as it is on the wire."""
    raw = encode(Frame(Kind.RESP_CHUNK, stream=5, data=b"data: {}\n\n"))
    assert raw == b"\x22\x00\x00\x00\x00\x05\x00\x00\x00\x00data: {}\n\n"
    assert decode(raw, LIMITS) == Frame(Kind.RESP_CHUNK, Flag(0), 5, {}, b"data: {}\n\n")


def test_meta_and_data_travel_side_by_side():
    raw = encode(Frame(Kind.REQ, Flag.MORE, 7, {"op": "call"}, b"{}"))
    assert raw == header(0x10, 1, 7, 13) + b'{"op":"call"}{}'


VIOLATIONS: list[tuple[str, bytes, str]] = [
    ("empty", b"", "short_header"),
    ("nine bytes", header(0x22, 0, 1)[:9], "short_header"),
    ("meta beyond the end", header(0x01, 0, 0, 5) + b"{}", "meta_length"),
    ("meta not JSON", header(0x01, 0, 0, 3) + b"{x}", "meta_not_object"),
    ("meta a list", header(0x01, 0, 0, 2) + b"[]", "meta_not_object"),
    ("meta a string", header(0x01, 0, 0, 4) + b'"hi"', "meta_not_object"),
    ("meta a number", header(0x01, 0, 0, 1) + b"1", "meta_not_object"),
    ("kind 0x00", header(0x00), "unknown_kind"),
    ("kind 0x14", header(0x14, 0, 1), "unknown_kind"),
    ("kind 0xff", header(0xFF), "unknown_kind"),
    ("flag 0x02", header(0x22, 0x02, 1), "unknown_flag"),
    ("flags 0x81", header(0x22, 0x81, 1), "unknown_flag"),
    ("MORE on a PING", header(0x06, 1, 0) + b"\0" * 8, "misplaced_flag"),
    ("MORE on a CANCEL", header(0x11, 1, 3), "misplaced_flag"),
    ("MORE on a PROBE_RESULT", header(0x23, 1, 3), "misplaced_flag"),
    ("a HELLO on stream 1", header(0x01, 0, 1), "stream_id"),
    ("a PING on stream 9", header(0x06, 0, 9), "stream_id"),
    ("a REQ on stream 0", header(0x10, 0, 0), "stream_id"),
    ("a chunk on stream 0", header(0x22, 0, 0), "stream_id"),
]


@pytest.mark.parametrize(
    ("raw", "reason"), [v[1:] for v in VIOLATIONS], ids=[v[0] for v in VIOLATIONS]
)
def test_each_malformed_frame_is_refused_with_its_reason(raw, reason):
    with pytest.raises(LinkViolation) as caught:
        decode(raw, LIMITS)
    assert caught.value.reason == reason


def test_violations_name_the_value_and_the_rule():
    with pytest.raises(LinkViolation, match=r"kind 0x14 is not a known kind"):
        decode(header(0x14, 0, 1), LIMITS)
    with pytest.raises(LinkViolation, match=r"flags 0x02; only MORE \(0x01\) is defined"):
        decode(header(0x22, 2, 1), LIMITS)
    with pytest.raises(LinkViolation, match=r"declares 5 bytes of meta, beyond its end"):
        decode(header(0x01, 0, 0, 5), LIMITS)
    with pytest.raises(LinkViolation, match=r"a REQ frame on stream 0; a REQ travels on a request"):
        decode(header(0x10), LIMITS)


def test_a_frame_over_the_cap_is_refused_and_one_at_the_cap_is_not():
    limits = LinkLimits(max_frame_bytes=64)
    at_cap = encode(Frame(Kind.RESP_CHUNK, stream=1, data=b"x" * 54))
    assert len(at_cap) == 64
    assert decode(at_cap, limits).data == b"x" * 54
    with pytest.raises(LinkViolation, match=r"65 bytes is over max_frame_bytes \(64\)") as caught:
        decode(at_cap + b"x", limits)
    assert caught.value.reason == "frame_too_large"


@given(
    st.sampled_from(sorted(CONTINUABLE)),
    metas,
    st.binary(max_size=2000),
    st.integers(200, 700),
)
def test_a_message_splits_into_frames_under_the_cap(kind, meta, data, cap):
    meta_size = len(orjson.dumps(meta)) if meta else 0
    if 10 + meta_size >= cap:
        with pytest.raises(ValueError, match="does not fit"):
            list(split(kind, 3, meta, data, cap))
        return
    parts = list(split(kind, 3, meta, data, cap))
    assert all(len(encode(p)) <= cap for p in parts)
    assert [p.more for p in parts] == [True] * (len(parts) - 1) + [False]
    assert parts[0].meta == meta
    assert all(p.meta == {} for p in parts[1:])
    assert b"".join(p.data for p in parts) == data
    assert all(p.data for p in parts[1:])
    assert {(p.kind, p.stream) for p in parts} == {(kind, 3)}


def test_a_message_that_fits_is_one_frame_and_a_link_message_never_splits():
    [whole] = split(Kind.RESP_CHUNK, 1, {}, b"x" * 54, 64)
    assert whole == Frame(Kind.RESP_CHUNK, Flag(0), 1, {}, b"x" * 54)
    with pytest.raises(ValueError, match="a PONG of 100 bytes of data cannot span frames"):
        list(split(Kind.PONG, 0, {}, b"x" * 100, 64))


KINDS_FROM_NODE = {
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
KINDS_FROM_EDGE = {Kind.WELCOME, Kind.PAYLOAD, Kind.REQ, Kind.CANCEL, Kind.WINDOW, Kind.PROBE}
KINDS_FROM_BOTH = {Kind.REFUSED, Kind.PING, Kind.PONG, Kind.GOAWAY}


def test_the_direction_table_covers_every_kind_once():
    assert FROM_NODE == KINDS_FROM_NODE
    assert FROM_EDGE == KINDS_FROM_EDGE
    assert set(Kind) == KINDS_FROM_NODE | KINDS_FROM_EDGE | KINDS_FROM_BOTH
    assert not KINDS_FROM_NODE & KINDS_FROM_EDGE
    assert not KINDS_FROM_BOTH & (KINDS_FROM_NODE | KINDS_FROM_EDGE)


@pytest.mark.parametrize("kind", list(Kind), ids=lambda k: k.name)
def test_each_kind_travels_only_in_its_direction(kind):
    for from_node, allowed in ((True, KINDS_FROM_NODE), (False, KINDS_FROM_EDGE)):
        if kind in allowed or kind in KINDS_FROM_BOTH:
            check_direction(kind, from_node=from_node)
        else:
            with pytest.raises(LinkViolation) as caught:
                check_direction(kind, from_node=from_node)
            assert caught.value.reason == "wrong_direction"
            assert kind.name in str(caught.value)


def test_a_req_from_a_node_names_the_rule():
    with pytest.raises(LinkViolation, match="a node sent REQ, which only the edge may send"):
        check_direction(Kind.REQ, from_node=True)


@given(st.integers(0, 2**64 - 1))
def test_a_ping_carries_the_monotonic_ns(ns):
    frame = decode(encode(Frame(Kind.PING, data=ping_data(ns))), LIMITS)
    assert ping_ns(frame) == ns


@given(st.integers(1, 2**32 - 1))
def test_a_window_carries_its_increment(increment):
    frame = decode(encode(Frame(Kind.WINDOW, stream=4, data=window_data(increment))), LIMITS)
    assert window_increment(frame) == increment


@pytest.mark.parametrize(
    ("frame", "read", "message"),
    [
        (Frame(Kind.PING, data=b"1234567"), ping_ns, "PING carries 7 bytes"),
        (Frame(Kind.PONG, data=b""), ping_ns, "PONG carries 0 bytes"),
        (Frame(Kind.WINDOW, stream=2, data=b"\0\0\1"), window_increment, "carries 3 bytes"),
        (Frame(Kind.WINDOW, stream=2, data=b"\0\0\0\0"), window_increment, "grants 0 bytes"),
    ],
)
def test_a_malformed_ping_or_window_is_a_bad_field(frame: Frame, read: Any, message: str) -> None:
    with pytest.raises(LinkViolation, match=message) as caught:
        read(frame)
    assert caught.value.reason == "bad_field"
