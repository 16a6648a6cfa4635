"""The link's handshake (issue 29, design §2): ``HELLO``, ``WELCOME`` and ``REFUSED`` and the
limits survive their meta; a protocol mismatch names both versions on either side; a missing or
mistyped field is a violation naming it; unknown fields are ignored."""

from __future__ import annotations

from typing import Any

import pytest

from iop_edge.link.handshake import (
    MAX_STREAMS_CEILING,
    Hello,
    LinkLimits,
    ProtocolMismatch,
    Refused,
    Welcome,
    parse_hello,
    parse_refused,
    parse_welcome,
)
from iop_edge.link.protocol import PROTOCOL_VERSION, LinkViolation

HELLO = Hello(
    protocol=PROTOCOL_VERSION, agent="0.2.0", hostname="gpu-box", pid=4242, have=("ab12", "cd34")
)
WELCOME = Welcome(
    protocol=PROTOCOL_VERSION,
    edge_id="edge-1",
    edge_version="0.2.0",
    node_id="gpu-1",
    heartbeat_ms=2000,
    limits=LinkLimits(window_bytes=1024, max_streams=40),
)


def test_the_limits_are_the_designs_defaults():
    limits = LinkLimits()
    assert limits.max_frame_bytes == 1024 * 1024
    assert limits.window_bytes == 256 * 1024
    assert limits.max_chunk_bytes == 16 * 1024 * 1024
    assert limits.max_reply_bytes == 64 * 1024 * 1024
    assert limits.max_request_bytes == 8 * 1024 * 1024 + 64 * 1024
    assert limits.max_link_buffer_bytes == 64 * 1024 * 1024
    assert limits.max_pings_per_second == 20
    assert limits.hello_timeout_ms == 10_000


def test_the_limits_survive_their_meta_and_ignore_unknown_fields():
    limits = LinkLimits(max_frame_bytes=4096, window_bytes=512, max_streams=7)
    meta = limits.to_meta()
    assert LinkLimits.from_meta(meta) == limits
    assert LinkLimits.from_meta({**meta, "max_widgets": 3}) == limits


@pytest.mark.parametrize(
    ("change", "reason", "message"),
    [
        ({"window_bytes": None}, "missing_field", "lacks the required field 'window_bytes'"),
        ({"window_bytes": "1"}, "bad_field", "'window_bytes' is '1'; it must be an integer"),
        ({"max_streams": True}, "bad_field", "'max_streams' is True"),
        ({"max_streams": 0}, "bad_field", "max_streams: 0 is not a positive integer"),
        ({"max_streams": 4097}, "bad_field", "max_streams: 4097 is over 4096"),
        ({"max_frame_bytes": 10}, "bad_field", "leaves no room after the 10-byte header"),
    ],
)
def test_bad_limits_are_violations_naming_the_field(change, reason, message):
    meta: dict[str, Any] = {**LinkLimits().to_meta(), **change}
    meta = {k: v for k, v in meta.items() if v is not None}
    with pytest.raises(LinkViolation, match=message) as caught:
        LinkLimits.from_meta(meta)
    assert caught.value.reason == reason


def test_limits_refuse_bad_values_where_they_are_built():
    with pytest.raises(ValueError, match=r"LinkLimits.window_bytes: -1 is not a positive"):
        LinkLimits(window_bytes=-1)
    with pytest.raises(ValueError, match=r"over 4096"):
        LinkLimits(max_streams=MAX_STREAMS_CEILING + 1)


def test_hello_welcome_and_refused_survive_their_meta():
    assert parse_hello(HELLO.to_meta()) == HELLO
    assert parse_welcome(WELCOME.to_meta()) == WELCOME
    refused = Refused("protocol", "upgrade", edge_protocol=1, node_protocol=2)
    assert parse_refused(refused.to_meta()) == refused
    assert parse_refused(Refused("stopping", "bye").to_meta()) == Refused("stopping", "bye")


def test_unknown_fields_are_ignored():
    assert parse_hello({**HELLO.to_meta(), "gpu": "h100"}) == HELLO
    assert parse_welcome({**WELCOME.to_meta(), "motd": "hi"}) == WELCOME
    assert parse_refused({"reason": "later", "message": "m", "x": 1}) == Refused("later", "m")


def test_a_node_of_another_version_is_told_both_versions():
    """The version check reads ``protocol`` before any other field: a v2 hello that lacks
    every v1 field still gets the message naming both versions."""
    with pytest.raises(ProtocolMismatch) as caught:
        parse_hello({"protocol": 2})
    assert str(caught.value) == (
        "iop-node speaks link protocol 2; this edge speaks 1: upgrade the older of iop-edge "
        "and iop-node"
    )
    assert (caught.value.edge_protocol, caught.value.node_protocol) == (1, 2)


def test_an_edge_of_another_version_is_named_by_the_node():
    with pytest.raises(ProtocolMismatch) as caught:
        parse_welcome({"protocol": 3})
    assert str(caught.value) == (
        "the edge speaks link protocol 3; this iop-node speaks 1: upgrade the older of "
        "iop-edge and iop-node"
    )
    assert (caught.value.edge_protocol, caught.value.node_protocol) == (3, 1)


@pytest.mark.parametrize(
    ("parse", "meta", "reason", "message"),
    [
        (parse_hello, {}, "missing_field", "HELLO meta lacks the required field 'protocol'"),
        (parse_hello, {"protocol": "1"}, "bad_field", "HELLO meta field 'protocol' is '1'"),
        (
            parse_hello,
            {**HELLO.to_meta(), "pid": None},
            "missing_field",
            "HELLO meta lacks the required field 'pid'",
        ),
        (
            parse_hello,
            {**HELLO.to_meta(), "have": ["a", 1]},
            "bad_field",
            "'have' holds a value that is not a string",
        ),
        (
            parse_hello,
            {**HELLO.to_meta(), "hostname": 5},
            "bad_field",
            "'hostname' is 5; it must be a string",
        ),
        (
            parse_welcome,
            {**WELCOME.to_meta(), "limits": None},
            "missing_field",
            "WELCOME meta lacks the required field 'limits'",
        ),
        (
            parse_welcome,
            {**WELCOME.to_meta(), "heartbeat_ms": 0},
            "bad_field",
            "'heartbeat_ms' is 0; it must be >= 1",
        ),
        (
            parse_welcome,
            {**WELCOME.to_meta(), "limits": {"window_bytes": 1}},
            "missing_field",
            "WELCOME.limits meta lacks the required field 'max_frame_bytes'",
        ),
        (parse_refused, {"message": "m"}, "missing_field", "lacks the required field 'reason'"),
        (parse_refused, {"reason": "x", "message": 1}, "bad_field", "'message' is 1"),
    ],
)
def test_a_missing_or_mistyped_field_is_a_violation_naming_it(parse, meta, reason, message):
    meta = {k: v for k, v in meta.items() if v is not None}
    with pytest.raises(LinkViolation, match=message) as caught:
        parse(meta)
    assert caught.value.reason == reason
