"""The OpenAI error envelope, and the status and code of every error the surface returns.

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
| input + max tokens over the context window  | 400    | ``context_length_exceeded`` |
| body over ``openai.max_body_bytes``         | 413    | ``request_too_large``      |
| queue full                                  | 429    | ``queue_full`` (+ Retry-After) |
| waited past ``queue_timeout_ms``            | 503    | ``queue_timeout``          |
| no enabled provider for the model           | 503    | ``no_available_provider``  |
| upstream failed / timed out                 | 502/504 | ``upstream_error`` / ``_timeout`` |
"""

from __future__ import annotations

from typing import Final

import orjson

from iop_edge.errors import AdapterError, AdmissionError, AuthError, IopEdgeError, RequestError

#: Seconds a client should wait before retrying a ``queue_full`` rejection.
RETRY_AFTER_SECONDS: Final = 1

_ADMISSION_STATUS: Final = {
    "queue_full": 429,
    "queue_timeout": 503,
    "no_available_provider": 503,
    "model_not_found": 404,
    "client_gone": 499,
}
_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
}


def envelope(message: str, code: str, *, status: int, param: str | None = None) -> bytes:
    """The OpenAI error body: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = _TYPES.get(status, "server_error")
    return orjson.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}})


def describe(exc: IopEdgeError) -> tuple[int, str, str | None]:
    """Status, code and param for an error raised while serving a request."""
    if isinstance(exc, RequestError):
        return exc.status, exc.code, exc.param
    if isinstance(exc, AuthError):
        return 401, exc.code, None
    if isinstance(exc, AdmissionError):
        return _ADMISSION_STATUS.get(exc.reason, 503), exc.reason, None
    if isinstance(exc, AdapterError):
        return exc.status, exc.code, getattr(exc, "param", None)
    return 500, "internal_error", None


def client_message(exc: IopEdgeError, provider: str | None) -> str:
    """The message a client sees. Upstream failures name the provider only: the adapter's own
    message (with URLs, commands, stderr) goes to the edge's log, not to the client."""
    if isinstance(exc, AdapterError) and exc.code in ("upstream_error", "upstream_timeout"):
        who = f"provider '{provider}'" if provider else "upstream"
        what = "did not answer in time" if exc.code == "upstream_timeout" else "failed"
        return (
            f"The {who} {what}; the edge's log has the details under this request's x-request-id."
        )
    return str(exc)


def error_headers(code: str) -> dict[str, str]:
    """Extra headers of an error response (``Retry-After`` on ``queue_full``)."""
    return {"Retry-After": str(RETRY_AFTER_SECONDS)} if code == "queue_full" else {}
