"""The edge's errors in Anthropic's shape: ``{"type": "error", "error": {"type", "message"}}``.

:data:`ANTHROPIC_ERRORS` maps every code the edge answers on its API listener — the closed sets
of :mod:`iop_edge.errors` and the surface's own (:data:`SURFACE_CODES`) — to Anthropic's error
type and HTTP status, one row each, so the docs can render it beside the OpenAI statuses of
:mod:`iop_edge.api.errors`. The choices that are not one-to-one:

- a saturated pool is ``overloaded_error`` 529 — a full queue, a wait past
  ``queue_timeout_ms``, no enabled provider, a request handed over that the successor could not
  take — which Anthropic's clients retry with backoff; a principal's own limits
  (``principal_queue_full``, ``rate_limit_exceeded``) are ``rate_limit_error`` 429;
- an upstream that failed is ``api_error`` 500, one that timed out ``timeout_error`` 504;
- statuses Anthropic never answers become its nearest: 415 (a body not declared JSON) → 400;
  ``client_gone`` (499) is never sent (the client left) and has a row only to be complete.

Codes that are not answers to a request on the API listener have no row: ``relayed``,
``client_error`` and ``client_stalled`` are request-line codes, ``too_many_connections`` is
refused by the listener before a request is read, ``daemon_stopping`` belongs to the admin API.

:func:`upstream_error_type` names the type of an upstream's own error status.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from iop_edge.translate.sse import dumps

__all__ = [
    "ANTHROPIC_ERRORS",
    "SURFACE_CODES",
    "AnthropicErrorType",
    "anthropic_error",
    "error_body",
    "error_payload",
    "upstream_error_type",
]

AnthropicErrorType = Literal[
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "not_found_error",
    "request_too_large",
    "rate_limit_error",
    "api_error",
    "timeout_error",
    "overloaded_error",
]

#: Codes the HTTP surface answers that are not in :mod:`iop_edge.errors`' sets.
SURFACE_CODES: Final = ("unknown_url", "method_not_allowed", "internal_error")

#: edge code → (Anthropic error type, HTTP status)
ANTHROPIC_ERRORS: Final[dict[str, tuple[AnthropicErrorType, int]]] = {
    # the request (RequestCode)
    "invalid_request_error": ("invalid_request_error", 400),
    "unsupported_parameter": ("invalid_request_error", 400),
    "unsupported_endpoint": ("invalid_request_error", 400),
    "context_length_exceeded": ("invalid_request_error", 400),
    "unsupported_media_type": ("invalid_request_error", 400),
    "request_too_large": ("request_too_large", 413),
    "model_not_found": ("not_found_error", 404),
    "response_not_found": ("not_found_error", 404),
    "origin_not_allowed": ("permission_error", 403),
    "host_not_allowed": ("permission_error", 403),
    # the credentials (AuthCode)
    "invalid_api_key": ("authentication_error", 401),
    "provider_auth_required": ("authentication_error", 401),
    "invalid_provider_auth": ("authentication_error", 401),
    "invalid_admin_token": ("authentication_error", 401),
    # admission (AdmissionReason; model_not_found above)
    "queue_full": ("overloaded_error", 529),
    "queue_timeout": ("overloaded_error", 529),
    "no_available_provider": ("overloaded_error", 529),
    "handed_over": ("overloaded_error", 529),
    "store_unavailable": ("overloaded_error", 529),
    "principal_queue_full": ("rate_limit_error", 429),
    "rate_limit_exceeded": ("rate_limit_error", 429),
    "client_gone": ("api_error", 499),
    # the upstream (AdapterCode)
    "upstream_error": ("api_error", 500),
    "upstream_timeout": ("timeout_error", 504),
    # the surface itself
    "unknown_url": ("not_found_error", 404),
    "method_not_allowed": ("invalid_request_error", 405),
    "internal_error": ("api_error", 500),
}

_STATUS_TYPES: Final[dict[int, AnthropicErrorType]] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def anthropic_error(code: str) -> tuple[AnthropicErrorType, int]:
    """Type and status of the edge's ``code`` (a code without a row is an ``api_error`` 500)."""
    return ANTHROPIC_ERRORS.get(code, ("api_error", 500))


def upstream_error_type(status: int) -> AnthropicErrorType:
    """The type of an upstream's own error status (relayed with that status): Anthropic's
    name for it, else ``invalid_request_error`` for another 4xx and ``api_error`` for 5xx."""
    kind = _STATUS_TYPES.get(status)
    if kind is not None:
        return kind
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


def error_payload(kind: AnthropicErrorType, message: str) -> dict[str, Any]:
    """The error object, as a body or as the data of a stream's ``error`` event."""
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_body(code: str, message: str) -> tuple[int, bytes]:
    """Status and JSON body of the answer refusing a request with the edge's ``code``."""
    kind, status = anthropic_error(code)
    return status, dumps(error_payload(kind, message))
