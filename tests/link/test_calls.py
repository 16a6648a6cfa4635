"""The adapter seam's values on the link (issue 29, design §1's table): every field and flag of
a call, a reply, a usage, an error and a probe survives the trip through a real frame."""

from __future__ import annotations

from typing import Any, get_args

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from iop_edge.adapters.base import (
    Endpoint,
    StreamBounds,
    UnsupportedRequestError,
    UpstreamCall,
    UpstreamReply,
    Usage,
)
from iop_edge.errors import AdapterCode, AdapterError, FailureKind, RequestCode
from iop_edge.link.calls import (
    CallRequest,
    call_body,
    call_from,
    call_meta,
    count_tokens_meta,
    error_from,
    error_meta,
    error_type,
    probe_from,
    probe_meta,
    probe_result_from,
    probe_result_meta,
    reply_from,
    reply_meta,
    tokens_from,
    tokens_meta,
    update_usage,
    usage_from,
    usage_meta,
)
from iop_edge.link.handshake import LinkLimits
from iop_edge.link.protocol import Frame, Kind, LinkViolation, decode, encode


def wire(kind: Kind, meta: dict[str, Any], data: bytes = b"") -> Frame:
    """The frame the peer receives for ``meta`` and ``data``: through encode and decode."""
    stream = 0 if kind is Kind.PING else 1
    return decode(encode(Frame(kind, stream=stream, meta=meta, data=data)), LinkLimits())


names = st.text(min_size=1, max_size=12)
optional_ints = st.none() | st.integers(0, 2**40)
usages = st.builds(Usage, optional_ints, optional_ints, st.booleans())
json_scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=10)
bodies = st.dictionaries(
    st.text(max_size=8),
    st.recursive(
        json_scalars,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
        ),
    ),
    max_size=5,
)
calls = st.builds(
    UpstreamCall,
    endpoint=st.sampled_from(get_args(Endpoint)),
    body=bodies,
    target=names,
    stream=st.booleans(),
    headers=st.dictionaries(names, st.text(max_size=20), max_size=3),
    request_id=names,
    model=st.text(max_size=12),
    estimated_prompt_tokens=optional_ints,
    bounds=st.none() | st.builds(StreamBounds, optional_ints, optional_ints),
)


@given(calls, st.booleans(), names)
def test_every_field_of_a_call_survives(call, on_provider, name):
    where = {"provider": name} if on_provider else {"adapter": name}
    frame = wire(Kind.REQ, call_meta(call, **where), call_body(call))
    request = call_from(frame.meta, frame.data)
    assert request == CallRequest("call", where.get("provider"), where.get("adapter"), call)


def test_a_call_names_a_provider_or_an_adapter_exactly():
    call = UpstreamCall("chat/completions", {}, "m", False, {}, "r")
    with pytest.raises(ValueError, match="give exactly one"):
        call_meta(call)
    with pytest.raises(ValueError, match="give exactly one"):
        call_meta(call, provider="p", adapter="a")
    meta = call_meta(call, provider="p")
    with pytest.raises(LinkViolation, match="exactly one of the two") as caught:
        call_from({**meta, "adapter": "a"}, b"{}")
    assert caught.value.reason == "bad_field"


@given(bodies, names, st.dictionaries(names, st.text(max_size=20), max_size=3), names, names)
def test_a_count_tokens_request_carries_what_count_tokens_takes(body, target, headers, rid, name):
    meta = count_tokens_meta(target, headers, rid, adapter=name)
    frame = wire(Kind.REQ, meta, orjson.dumps(body))
    request = call_from(frame.meta, frame.data)
    assert (request.op, request.provider, request.adapter) == ("count_tokens", None, name)
    assert (request.call.body, request.call.target, dict(request.call.headers)) == (
        body,
        target,
        headers,
    )
    assert request.call.request_id == rid


@pytest.mark.parametrize(
    ("change", "data", "message"),
    [
        ({"op": "delete"}, b"{}", "REQ op 'delete' is neither 'call' nor 'count_tokens'"),
        ({"call": {"endpoint": "files"}}, b"{}", "REQ.call endpoint 'files' is not an endpoint"),
        ({}, b"[1]", "a REQ's data is a JSON list, not an object"),
        ({}, b"{", "a REQ's data is not valid JSON"),
        ({"call": {"headers": {"a": 1}}}, b"{}", "headers must map names to strings"),
        ({"call": {"stream": "yes"}}, b"{}", "'stream' is 'yes'; it must be a boolean"),
        ({"call": {"bounds": {"idle_ms": 1.5}}}, b"{}", "'idle_ms' is 1.5; it must be an integer"),
    ],
)
def test_a_malformed_request_is_a_violation_naming_the_field(change, data, message):
    meta = call_meta(UpstreamCall("chat/completions", {}, "m", True, {}, "r"), provider="p")
    meta = {**meta, **change, "call": {**meta["call"], **change.get("call", {})}}
    with pytest.raises(LinkViolation, match=message) as caught:
        call_from(meta, data)
    assert caught.value.reason == "bad_field"


@given(
    st.integers(100, 599),
    st.binary(max_size=200),
    usages,
    st.none() | st.text(max_size=40),
    st.none() | st.floats(0, 1e6) | st.integers(0, 86400),
)
def test_every_field_of_a_reply_survives(status, body, usage, detail, retry_after):
    reply = UpstreamReply(status, body, usage, detail, retry_after)
    frame = wire(Kind.RESP_REPLY, reply_meta(reply), reply.body)
    back = reply_from(frame.meta, frame.data)
    assert back == reply
    assert back.retry_after is None or isinstance(back.retry_after, float)


@given(usages)
def test_usage_survives_and_updates_the_same_object(usage):
    frame = wire(Kind.RESP_END, {"usage": usage_meta(usage)})
    assert usage_from(frame.meta["usage"]) == usage
    kept = Usage(prompt_tokens=999, completion_tokens=999, estimated=not usage.estimated)
    update_usage(kept, frame.meta["usage"])
    assert kept == usage


def test_no_usage_leaves_it_as_it_is():
    kept = Usage(3, 4, True)
    update_usage(kept, None)
    assert kept == Usage(3, 4, True)
    assert usage_from(None) == Usage()
    with pytest.raises(LinkViolation, match="usage is a list, not an object"):
        update_usage(kept, [])


@given(
    code=st.sampled_from(get_args(AdapterCode)),
    message=st.text(max_size=40),
    status=st.integers(400, 599),
    failure=st.none() | st.sampled_from(get_args(FailureKind)),
    failover=st.booleans(),
    error_relayed=st.booleans(),
    usage=st.none() | usages,
    kind=st.none() | st.sampled_from(["cancelled", "internal"]),
)
def test_every_field_and_flag_of_an_adapter_error_survives(
    code, message, status, failure, failover, error_relayed, usage, kind
):
    error = AdapterError(
        code,
        message,
        status=status,
        failure=failure,
        failover=failover,
        error_relayed=error_relayed,
    )
    frame = wire(Kind.RESP_ERROR, error_meta(error, usage=usage, kind=kind))
    back = error_from(frame.meta)
    assert type(back) is AdapterError
    assert (str(back), back.code, back.status, back.failure, back.failover, back.error_relayed) == (
        message,
        code,
        status,
        failure,
        failover,
        error_relayed,
    )
    assert error_type(frame.meta) == (kind or "adapter")
    assert usage_from(frame.meta.get("usage")) == (usage or Usage())


@given(
    message=st.text(max_size=40),
    param=st.none() | st.text(max_size=12),
    code=st.sampled_from(get_args(RequestCode)),
)
def test_every_field_of_an_unsupported_request_survives(message, param, code):
    error = UnsupportedRequestError(message, param=param, code=code)
    frame = wire(Kind.RESP_ERROR, error_meta(error))
    back = error_from(frame.meta)
    assert type(back) is UnsupportedRequestError
    assert (str(back), back.code, back.status, back.param) == (message, code, 400, param)
    assert error_type(frame.meta) == "request"


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        ({"type": "adapter", "code": "teapot", "message": "m"}, "code 'teapot' is not an adapter"),
        ({"type": "request", "code": "upstream_error", "message": "m"}, "is not a request code"),
        (
            {
                "type": "adapter",
                "code": "upstream_error",
                "message": "m",
                "status": 502,
                "failure": "melted",
                "failover": False,
                "error_relayed": False,
            },
            "failure 'melted' is not a failure kind",
        ),
        ({"type": "adapter", "message": "m"}, "lacks the required field 'code'"),
        (
            {"type": "adapter", "code": "upstream_error", "message": "m", "status": 502},
            "lacks the required field 'failover'",
        ),
    ],
)
def test_a_malformed_error_is_a_violation(meta, message):
    with pytest.raises(LinkViolation, match=message):
        error_from(meta)


@given(st.none() | st.integers(0, 2**31))
def test_a_token_count_survives(tokens):
    assert tokens_from(wire(Kind.RESP_REPLY, tokens_meta(tokens)).meta) == tokens


@given(names, st.booleans(), st.none() | st.text(max_size=30))
def test_a_probe_and_its_result_survive(provider, ok, reason):
    assert probe_from(wire(Kind.PROBE, probe_meta(provider)).meta) == provider
    result = wire(Kind.PROBE_RESULT, probe_result_meta((ok, reason))).meta
    assert probe_result_from(result) == (ok, reason)
