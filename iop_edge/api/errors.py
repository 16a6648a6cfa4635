"""The status and code of every error the surface returns (the envelope is built by
:func:`iop_edge.envelope.envelope`, re-exported here).

| situation                                   | status | code                     |
| ------------------------------------------- | ------ | ------------------------ |
| missing/unknown/malformed bearer token      | 401    | ``invalid_api_key``        |
| provider auth required and header missing   | 401    | ``provider_auth_required`` |
| provider credential not printable ASCII     | 401    | ``invalid_provider_auth``  |
| admin API: missing/wrong admin token        | 401    | ``invalid_admin_token``    |
| ``Origin`` not on the allow-list            | 403    | ``origin_not_allowed``     |
| non-loopback ``Host`` on a tokenless surface | 403   | ``host_not_allowed``       |
| POST whose body is not declared JSON        | 415    | ``unsupported_media_type`` |
| unknown model                               | 404    | ``model_not_found``        |
| malformed body / bad field                  | 400    | ``invalid_request_error``  |
| no provider of the model serves the endpoint | 400   | ``unsupported_endpoint``   |
| a field no provider of the model honours    | 400    | ``unsupported_parameter``  |
| unknown path / known path, other method     | 404/405 | ``unknown_url`` / ``method_not_allowed`` |
| input + max tokens over the context window  | 400    | ``context_length_exceeded`` |
| body over ``openai.max_body_bytes``         | 413    | ``request_too_large``      |
| queue full                                  | 429    | ``queue_full`` (+ Retry-After) |
| the principal's ``max_queued`` reached       | 429    | ``principal_queue_full`` (+ Retry-After) |
| over its ``max_requests_per_minute``         | 429    | ``rate_limit_exceeded`` (+ Retry-After) |
| waited past ``queue_timeout_ms``            | 503    | ``queue_timeout``          |
| no enabled provider for the model           | 503    | ``no_available_provider``  |
| shared pool's store unreachable (``reject``) | 503    | ``store_unavailable``      |
| upstream failed / timed out                 | 502/504 | ``upstream_error`` / ``_timeout`` |
"""

from __future__ import annotations

from typing import Final

from iop_edge.errors import (
    AdapterError,
    AdmissionError,
    AdmissionReason,
    AuthError,
    IopEdgeError,
    LeaseLost,
    RequestError,
)

#: Seconds a client should wait before retrying a ``queue_full`` rejection.
RETRY_AFTER_SECONDS: Final = 1

#: The status of each admission rejection (mypy checks the keys; a test checks every reason
#: of :class:`iop_edge.pool.RejectReason` has one).
ADMISSION_STATUS: Final[dict[AdmissionReason, int]] = {
    "queue_full": 429,
    "principal_queue_full": 429,
    "rate_limit_exceeded": 429,
    "handed_over": 503,  # (relayed to the successor, never shown unless that fails)
    "queue_timeout": 503,
    "no_available_provider": 503,
    "store_unavailable": 503,
    "model_not_found": 404,
    "client_gone": 499,
}


def describe(exc: IopEdgeError) -> tuple[int, str, str | None]:
    """Status, code and param for an error raised while serving a request."""
    if isinstance(exc, RequestError):
        return exc.status, exc.code, exc.param
    if isinstance(exc, AuthError):
        return 401, exc.code, None
    if isinstance(exc, AdmissionError):
        return ADMISSION_STATUS[exc.reason], exc.reason, None
    if isinstance(exc, AdapterError):
        return exc.status, exc.code, None
    return 500, "internal_error", None


def client_message(exc: IopEdgeError, provider: str | None) -> str:
    """The message a client sees. Upstream failures name the provider only: the adapter's own
    message (with URLs, commands, stderr) goes to the edge's log, not to the client."""
    if isinstance(exc, LeaseLost):
        return str(exc)  # (it names nothing internal)
    if isinstance(exc, AdapterError) and exc.code in ("upstream_error", "upstream_timeout"):
        who = f"provider '{provider}'" if provider else "upstream"
        what = "did not answer in time" if exc.code == "upstream_timeout" else "failed"
        return (
            f"The {who} {what}; the edge's log has the details under this request's x-request-id."
        )
    return str(exc)


def error_headers(code: str) -> dict[str, str]:
    """Extra headers of an error response (``Retry-After`` on the queue-full refusals)."""
    if code in ("queue_full", "principal_queue_full"):
        return {"Retry-After": str(RETRY_AFTER_SECONDS)}
    return {}
