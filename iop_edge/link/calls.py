"""What the adapter seam's values look like on the link: an :class:`UpstreamCall` as a ``REQ``,
an :class:`UpstreamReply` as a ``RESP_REPLY``, a :class:`Usage`, an
:class:`~iop_edge.errors.AdapterError` or :class:`UnsupportedRequestError` as a
``RESP_ERROR``, a health check as ``PROBE`` / ``PROBE_RESULT`` — each mapped there and back
with every field and flag kept, so that the edge sees a remote provider's results exactly as
the node's adapters produced them.

Each ``*_meta`` function builds a frame's meta (the body, where there is one, travels as the
frame's data); each ``*_from`` reads one back and raises
:class:`~iop_edge.link.protocol.LinkViolation` for a missing or mistyped field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, cast, get_args

import orjson

from iop_edge.adapters.base import (
    Endpoint,
    StreamBounds,
    UnsupportedRequestError,
    UpstreamCall,
    UpstreamReply,
    Usage,
)
from iop_edge.errors import AdapterCode, AdapterError, FailureKind, RequestCode
from iop_edge.link.protocol import LinkViolation, optional_field, require_field
from iop_edge.seams import ProbeResult

__all__ = [
    "CallOp",
    "CallRequest",
    "ErrorType",
    "call_body",
    "call_from",
    "call_meta",
    "count_tokens_meta",
    "error_from",
    "error_meta",
    "error_type",
    "probe_from",
    "probe_meta",
    "probe_result_from",
    "probe_result_meta",
    "reply_from",
    "reply_meta",
    "tokens_from",
    "tokens_meta",
    "update_usage",
    "usage_from",
    "usage_meta",
]

CallOp = Literal["call", "count_tokens"]
"""What a ``REQ`` asks: run the call (``complete`` or ``open_stream``, by its ``stream``), or
count a chat body's tokens (``count_tokens``)."""

ErrorType = Literal["adapter", "request", "cancelled", "internal"]
"""``RESP_ERROR.type``: the adapter failed (``adapter``), refused the request (``request``:
:class:`UnsupportedRequestError`), the call was cancelled after a ``CANCEL`` (``cancelled``,
the terminal acknowledgement) or the node failed on its own (``internal``)."""

_ENDPOINTS: Final[frozenset[str]] = frozenset(get_args(Endpoint))
_ADAPTER_CODES: Final[frozenset[str]] = frozenset(get_args(AdapterCode))
_REQUEST_CODES: Final[frozenset[str]] = frozenset(get_args(RequestCode))
_FAILURES: Final[frozenset[str]] = frozenset(get_args(FailureKind))


@dataclass(frozen=True, slots=True)
class CallRequest:
    """A ``REQ`` as the node reads it: what to run it on (a ``provider``, or an ``adapter``
    instance for a model route) and the call. For ``count_tokens`` the call carries the chat
    body, target, headers and request id of :meth:`~iop_edge.adapters.base.Executor.count_tokens`
    (its other fields are unused)."""

    op: CallOp
    provider: str | None
    adapter: str | None
    call: UpstreamCall


def call_meta(
    call: UpstreamCall, *, provider: str | None = None, adapter: str | None = None
) -> dict[str, Any]:
    """A ``REQ``'s meta for running ``call`` on ``provider`` (or on ``adapter``, a model
    route); its data is :func:`call_body`."""
    bounds = call.bounds
    return {
        "op": "call",
        **_executor(provider, adapter),
        "call": {
            "endpoint": call.endpoint,
            "target": call.target,
            "stream": call.stream,
            "headers": dict(call.headers),
            "request_id": call.request_id,
            "model": call.model,
            "estimated_prompt_tokens": call.estimated_prompt_tokens,
            "bounds": None
            if bounds is None
            else {"first_token_ms": bounds.first_token_ms, "idle_ms": bounds.idle_ms},
        },
    }


def call_body(call: UpstreamCall) -> bytes:
    """A ``REQ``'s data: the call's body as JSON."""
    return orjson.dumps(call.body)


def count_tokens_meta(
    target: str,
    headers: Mapping[str, str],
    request_id: str,
    *,
    provider: str | None = None,
    adapter: str | None = None,
) -> dict[str, Any]:
    """A ``count_tokens`` ``REQ``'s meta; its data is the chat body as JSON."""
    return {
        "op": "count_tokens",
        **_executor(provider, adapter),
        "call": {
            "endpoint": "chat/completions",
            "target": target,
            "stream": False,
            "headers": dict(headers),
            "request_id": request_id,
        },
    }


def call_from(meta: Mapping[str, Any], body: bytes) -> CallRequest:
    """The call of a complete ``REQ`` message (``meta``, and its data ``body``)."""
    op = require_field(meta, "op", str, "REQ")
    if op not in ("call", "count_tokens"):
        raise LinkViolation("bad_field", f"REQ op {op!r} is neither 'call' nor 'count_tokens'")
    provider = optional_field(meta, "provider", str, "REQ")
    adapter = optional_field(meta, "adapter", str, "REQ")
    if (provider is None) == (adapter is None):
        raise LinkViolation(
            "bad_field", "a REQ names a provider or an adapter, exactly one of the two"
        )
    fields = require_field(meta, "call", dict, "REQ")
    endpoint = require_field(fields, "endpoint", str, "REQ.call")
    if endpoint not in _ENDPOINTS:
        raise LinkViolation("bad_field", f"REQ.call endpoint {endpoint!r} is not an endpoint")
    headers = require_field(fields, "headers", dict, "REQ.call")
    if not all(isinstance(v, str) for v in headers.values()):
        raise LinkViolation("bad_field", "REQ.call headers must map names to strings")
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise LinkViolation("bad_field", f"a REQ's data is not valid JSON ({exc})") from None
    if not isinstance(parsed, dict):
        raise LinkViolation(
            "bad_field", f"a REQ's data is a JSON {type(parsed).__name__}, not an object"
        )
    bounds = optional_field(fields, "bounds", dict, "REQ.call")
    call = UpstreamCall(
        endpoint=cast("Endpoint", endpoint),
        body=parsed,
        target=require_field(fields, "target", str, "REQ.call"),
        stream=require_field(fields, "stream", bool, "REQ.call"),
        headers=headers,
        request_id=require_field(fields, "request_id", str, "REQ.call"),
        model=optional_field(fields, "model", str, "REQ.call") or "",
        estimated_prompt_tokens=optional_field(fields, "estimated_prompt_tokens", int, "REQ.call"),
        bounds=None
        if bounds is None
        else StreamBounds(
            first_token_ms=optional_field(bounds, "first_token_ms", int, "REQ.call.bounds"),
            idle_ms=optional_field(bounds, "idle_ms", int, "REQ.call.bounds"),
        ),
    )
    return CallRequest(cast("CallOp", op), provider, adapter, call)


def _executor(provider: str | None, adapter: str | None) -> dict[str, str]:
    if (provider is None) == (adapter is None):
        raise ValueError("a REQ runs on a provider or on an adapter: give exactly one")
    return {"provider": provider} if provider is not None else {"adapter": cast("str", adapter)}


def usage_meta(usage: Usage) -> dict[str, Any]:
    """A :class:`Usage` as meta (``RESP_REPLY.usage``, ``RESP_END.usage``,
    ``RESP_ERROR.usage``)."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "estimated": usage.estimated,
    }


def usage_from(value: Any) -> Usage:
    """The :class:`Usage` of a ``usage`` meta value (``None``: nothing reported)."""
    usage = Usage()
    update_usage(usage, value)
    return usage


def update_usage(usage: Usage, value: Any) -> None:
    """Set ``usage``'s fields, in place, from a ``usage`` meta value (the edge keeps the
    :class:`Usage` object its stream handed out, which the attempt reads at the end); ``None``
    leaves it as it is."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise LinkViolation("bad_field", f"usage is a {type(value).__name__}, not an object")
    usage.prompt_tokens = optional_field(value, "prompt_tokens", int, "usage")
    usage.completion_tokens = optional_field(value, "completion_tokens", int, "usage")
    usage.estimated = optional_field(value, "estimated", bool, "usage") or False


def reply_meta(reply: UpstreamReply) -> dict[str, Any]:
    """A ``RESP_REPLY``'s meta for ``reply``; its data is ``reply.body``."""
    return {
        "status": reply.status,
        "detail": reply.detail,
        "retry_after": reply.retry_after,
        "usage": usage_meta(reply.usage),
    }


def reply_from(meta: Mapping[str, Any], body: bytes) -> UpstreamReply:
    """The :class:`UpstreamReply` of a complete ``RESP_REPLY`` message."""
    return UpstreamReply(
        status=require_field(meta, "status", int, "RESP_REPLY"),
        body=body,
        usage=usage_from(meta.get("usage")),
        detail=optional_field(meta, "detail", str, "RESP_REPLY"),
        retry_after=optional_field(meta, "retry_after", float, "RESP_REPLY"),
    )


def tokens_meta(tokens: int | None) -> dict[str, Any]:
    """A ``count_tokens`` answer's ``RESP_REPLY`` meta (``None``: this upstream cannot
    count)."""
    return {"tokens": tokens}


def tokens_from(meta: Mapping[str, Any]) -> int | None:
    """The count of a ``count_tokens`` ``RESP_REPLY``."""
    return optional_field(meta, "tokens", int, "RESP_REPLY")


def error_meta(
    exc: AdapterError | UnsupportedRequestError,
    *,
    usage: Usage | None = None,
    kind: ErrorType | None = None,
) -> dict[str, Any]:
    """A ``RESP_ERROR``'s meta for ``exc``: every field and flag, the stream's ``usage`` so
    far when given. ``kind`` overrides the type (``cancelled``, ``internal``); by default it
    is ``request`` for an :class:`UnsupportedRequestError`, else ``adapter``. Its data is the
    stream's final response, if any."""
    meta: dict[str, Any]
    if isinstance(exc, UnsupportedRequestError):
        meta = {
            "type": kind or "request",
            "code": exc.code,
            "message": str(exc),
            "status": exc.status,
            "param": exc.param,
        }
    else:
        meta = {
            "type": kind or "adapter",
            "code": exc.code,
            "message": str(exc),
            "status": exc.status,
            "failure": exc.failure,
            "failover": exc.failover,
            "error_relayed": exc.error_relayed,
        }
    if usage is not None:
        meta["usage"] = usage_meta(usage)
    return meta


def error_type(meta: Mapping[str, Any]) -> str:
    """A ``RESP_ERROR``'s type (:data:`ErrorType`; a later version may add others)."""
    return require_field(meta, "type", str, "RESP_ERROR")


def error_from(meta: Mapping[str, Any]) -> AdapterError | UnsupportedRequestError:
    """The exception a ``RESP_ERROR`` carries, raised again on the edge: an
    :class:`UnsupportedRequestError` for type ``request``, else an
    :class:`~iop_edge.errors.AdapterError` with the node's fields and flags."""
    code = require_field(meta, "code", str, "RESP_ERROR")
    message = require_field(meta, "message", str, "RESP_ERROR")
    if error_type(meta) == "request":
        if code not in _REQUEST_CODES:
            raise LinkViolation("bad_field", f"RESP_ERROR code {code!r} is not a request code")
        return UnsupportedRequestError(
            message,
            param=optional_field(meta, "param", str, "RESP_ERROR"),
            code=cast("RequestCode", code),
        )
    if code not in _ADAPTER_CODES:
        raise LinkViolation("bad_field", f"RESP_ERROR code {code!r} is not an adapter code")
    failure = optional_field(meta, "failure", str, "RESP_ERROR")
    if failure is not None and failure not in _FAILURES:
        raise LinkViolation("bad_field", f"RESP_ERROR failure {failure!r} is not a failure kind")
    return AdapterError(
        cast("AdapterCode", code),
        message,
        status=require_field(meta, "status", int, "RESP_ERROR"),
        failure=cast("FailureKind | None", failure),
        failover=require_field(meta, "failover", bool, "RESP_ERROR"),
        error_relayed=require_field(meta, "error_relayed", bool, "RESP_ERROR"),
    )


def probe_meta(provider: str) -> dict[str, Any]:
    """A ``PROBE``'s meta: run ``provider``'s health check."""
    return {"provider": provider}


def probe_from(meta: Mapping[str, Any]) -> str:
    """The provider a ``PROBE`` names."""
    return require_field(meta, "provider", str, "PROBE")


def probe_result_meta(result: ProbeResult) -> dict[str, Any]:
    """A ``PROBE_RESULT``'s meta."""
    ok, reason = result
    return {"ok": ok, "reason": reason}


def probe_result_from(meta: Mapping[str, Any]) -> ProbeResult:
    """The verdict of a ``PROBE_RESULT``."""
    return (
        require_field(meta, "ok", bool, "PROBE_RESULT"),
        optional_field(meta, "reason", str, "PROBE_RESULT"),
    )
