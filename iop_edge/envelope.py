"""The OpenAI error envelope, ``{"error": {"message", "type", "param", "code"}}``: one builder
for the whole package — the surface's own errors, wrapped upstream errors and the listeners'
refusals — so a status always gets the same ``type`` and every OpenAI SDK raises its usual
exception class."""

from __future__ import annotations

from typing import Final

import orjson

__all__ = ["envelope", "error_type"]

_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
}


def error_type(status: int) -> str:
    """The envelope's ``type`` for ``status``: OpenAI's own names where it has one, else
    ``invalid_request_error`` for a 4xx and ``server_error`` for anything else."""
    kind = _TYPES.get(status)
    if kind is not None:
        return kind
    return "invalid_request_error" if 400 <= status < 500 else "server_error"


def envelope(message: str, code: str | None, *, status: int, param: str | None = None) -> bytes:
    """The OpenAI error body for an answer of ``status``."""
    body = {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}
    return orjson.dumps(body)
