"""Checks against browsers on the request path, and what aiohttp may write to the log.

A web page can make its visitor's browser send requests to a loopback edge: a form POST or a
``fetch`` (cross-origin; the page cannot read the answer, but the request runs — an admin
refresh, a cli provider), or, with DNS rebinding (a name of the page's own that first resolves
to the page's server, then to 127.0.0.1), same-origin requests whose answers it reads. Three
checks close that:

===============  =====================================================  =====================
check            applies to                                             refusal
===============  =====================================================  =====================
``Origin``       every request carrying the header (browsers add it;    403
                 SDKs, curl and the CLI do not): allowed only when it   ``origin_not_allowed``
                 is on ``openai.allowed_origins``; the admin API
                 allows none
``Host``         an open (tokenless) OpenAI surface on loopback, and    403
                 the admin API without an admin token: only loopback    ``host_not_allowed``
                 names (``localhost``, ``127.x.y.z``, ``[::1]``, with
                 or without a port)
``Content-Type`` every POST: a body must be declared JSON               415
                 (``application/json`` or ``application/*+json``) — a   ``unsupported_media_
                 browser cannot send that cross-origin without asking   type``
                 first (a CORS preflight); a bodyless POST may not
                 declare a form or text type
===============  =====================================================  =====================

Cost on the request path: one header look-up when there is no ``Origin`` (the common case,
nothing else is done), a set look-up when there is one; the ``Host`` verdict is cached per
distinct value (bounded); the JSON content type is matched against a set of the usual spellings
before anything is parsed.

:func:`install_log_scrubber` keeps request bytes out of what aiohttp logs: its HTTP parser
quotes the offending header line — a token with a control character in it — in the message of
the exception it logs for a malformed request.
"""

from __future__ import annotations

import ipaddress
import logging
import traceback
from collections.abc import Iterable, Mapping
from typing import Final

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from iop_edge.envelope import envelope
from iop_edge.errors import RequestError

__all__ = [
    "Cors",
    "RequestGuard",
    "exception_summary",
    "install_log_scrubber",
    "is_loopback_host",
    "require_json_body",
]

_LOOPBACK_NAMES: Final = frozenset({"localhost", "localhost.", "127.0.0.1", "[::1]"})
_JSON_TYPES: Final = frozenset(
    {
        "application/json",
        "application/json; charset=utf-8",
        "application/json;charset=utf-8",
        "application/json; charset=UTF-8",
        "application/json;charset=UTF-8",
    }
)
#: The content types a page can send cross-origin without a CORS preflight (an HTML form).
_SIMPLE_TYPES: Final = frozenset(
    {"application/x-www-form-urlencoded", "multipart/form-data", "text/plain"}
)
_HOST_CACHE_SIZE: Final = 64


def _show(value: str) -> str:
    """A header value quoted for a message: escaped (``repr``), at most 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def is_loopback_host(host: str) -> bool:
    """True when a ``Host`` header value names this machine: ``localhost``, any
    ``127.x.y.z``, or ``[::1]``, with or without a port."""
    if host in _LOOPBACK_NAMES:
        return True
    if host.startswith("["):
        address, bracket, port = host[1:].partition("]")
        if not bracket or (port and not (port[0] == ":" and _digits(port[1:]))):
            return False
        try:
            return ipaddress.IPv6Address(address).is_loopback
        except ValueError:
            return False
    name, colon, port = host.partition(":")
    if colon and not _digits(port):
        return False
    name = name.lower()
    if name in ("localhost", "localhost."):
        return True
    if not name.startswith("127."):
        return False
    try:
        ipaddress.IPv4Address(name)
    except ValueError:
        return False
    return True


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _media_type(content_type: str) -> str:
    return content_type.partition(";")[0].strip().lower()


def _is_json_type(content_type: str) -> bool:
    media = _media_type(content_type)
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def require_json_body(request: web.BaseRequest) -> None:
    """Raise 415 ``unsupported_media_type`` unless a POST's body is declared JSON.

    A POST without a body (``iop-edge config refresh``, ``curl -X POST``, an HTTP library's
    default ``application/octet-stream``) passes, unless it declares one of the types an HTML
    form or a browser's simple request sends (form, multipart, text): those are the requests a
    web page can make without the browser asking the edge first.
    """
    content_type = request.headers.get("Content-Type")
    if content_type is not None and (content_type in _JSON_TYPES or _is_json_type(content_type)):
        return
    if not request.body_exists and (
        content_type is None or _media_type(content_type) not in _SIMPLE_TYPES
    ):
        return
    if content_type is None:
        sent = "no Content-Type header"
    else:
        sent = f"Content-Type: {_show(content_type)}"
    raise RequestError(
        "unsupported_media_type",
        "The request body must be JSON: send the header 'Content-Type: application/json' "
        f"(this request sent {sent}).",
        status=415,
    )


class RequestGuard:
    """The ``Origin`` and ``Host`` checks of one listener (see the module docstring).

    ``allowed_origins`` are compared as strings (the config stores them as browsers send
    them); ``loopback_hosts_only`` turns the ``Host`` rule on, ``why_loopback`` finishes its
    refusal message (what to configure to serve other names).
    """

    __slots__ = ("_hosts", "_loopback_only", "_no_origin", "_origins", "_why_loopback")

    def __init__(
        self,
        *,
        allowed_origins: Iterable[str],
        loopback_hosts_only: bool,
        no_origin: str,
        why_loopback: str = "",
    ) -> None:
        self._origins = frozenset(allowed_origins)
        self._no_origin = no_origin
        self._loopback_only = loopback_hosts_only
        self._why_loopback = why_loopback
        self._hosts: dict[str, bool] = {}

    @property
    def allowed_origins(self) -> frozenset[str]:
        """The browser origins this listener answers."""
        return self._origins

    def check(self, headers: Mapping[str, str]) -> str | None:
        """Raise 403 for a foreign ``Origin`` or (when the rule is on) a non-loopback
        ``Host``; return the allowed ``Origin`` of a browser request, else None."""
        origin = headers.get("Origin")
        if origin is not None and origin not in self._origins:
            raise RequestError(
                "origin_not_allowed",
                f"Browser requests from the origin {_show(origin)} are not allowed: "
                f"{self._no_origin}",
                status=403,
            )
        if self._loopback_only:
            host = headers.get("Host")
            if host is not None and not self._loopback(host):
                raise RequestError(
                    "host_not_allowed",
                    f"The Host {_show(host)} is not a loopback name; this listener answers only "
                    "requests addressed to localhost, 127.x.y.z or [::1] (a guard against DNS "
                    f"rebinding), because {self._why_loopback}",
                    status=403,
                )
        return origin

    def _loopback(self, host: str) -> bool:
        verdict = self._hosts.get(host)
        if verdict is None:
            verdict = is_loopback_host(host)
            if len(self._hosts) < _HOST_CACHE_SIZE:
                self._hosts[host] = verdict
        return verdict


class Cors:
    """CORS for the origins of ``openai.allowed_origins`` (built only when there are some):
    preflights are answered, and answers to an allowed origin carry
    ``Access-Control-Allow-Origin`` so that its pages can read them. No cookies are involved
    (the edge authenticates with bearer tokens), so credentials mode is never allowed."""

    def __init__(self, guard: RequestGuard, provider_header: str) -> None:
        self._guard = guard
        self._preflight_headers = {
            "Access-Control-Allow-Methods": "GET, POST",
            "Access-Control-Allow-Headers": ", ".join(
                ("Authorization", "Content-Type", "X-Request-Id", provider_header)
            ),
            "Access-Control-Max-Age": "600",
        }

    async def preflight(self, request: web.Request) -> web.Response:
        """``OPTIONS /v1/...``: 204 with what an allowed origin may send; 403 otherwise."""
        try:
            origin = self._guard.check(request.headers)
        except RequestError as exc:
            body = envelope(str(exc), exc.code, status=exc.status)
            return web.Response(body=body, status=exc.status, content_type="application/json")
        if origin is None:  # not a browser: nothing to grant
            return web.Response(status=204, headers={"Allow": "GET, POST, OPTIONS"})
        return web.Response(status=204, headers=self._preflight_headers)

    async def allow(self, request: web.BaseRequest, response: web.StreamResponse) -> None:
        """``on_response_prepare``: let an allowed origin read this answer."""
        origin = request.headers.get("Origin")
        if origin is not None and origin in self._guard.allowed_origins:
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Expose-Headers"] = "x-request-id, x-iop-provider"
            response.headers.add("Vary", "Origin")


# --- what reaches the log ----------------------------------------------------------------------


def exception_summary(exc: BaseException) -> tuple[str, list[str]]:
    """The type of ``exc`` and where it was raised — ``file:line in function`` per frame,
    outermost first — without its message, which may quote request data (a header, a token)."""
    frames = [
        f"{frame.filename}:{frame.lineno} in {frame.name}"
        for frame in traceback.extract_tb(exc.__traceback__)
    ]
    return type(exc).__qualname__, frames


class _ScrubExceptions(logging.Filter):
    """Replaces the exception of an aiohttp log record by its summary: the type, the parser's
    description of a malformed request (its message without the quoted bytes), the frames."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info is None or record.exc_info[1] is None:
            return True
        exc = record.exc_info[1]
        kind, frames = exception_summary(exc)
        if isinstance(exc, HttpProcessingError):
            # The C parser's message is "description:\n\n  b'<the bytes>'\n  ^": keep the
            # description; other messages may quote the request line or a header.
            message = str(exc.message)
            description = message.partition(":\n")[0] if ":\n" in message else ""
            detail = f"{kind} {exc.code} {description}".rstrip()
        else:
            detail = f"{kind} (message left out: it may quote the request) at " + " -> ".join(
                frames
            )
        message = record.getMessage()
        record.msg, record.args = "%s: %s", (message, detail)
        record.exc_info = None
        record.exc_text = None
        return True


_SCRUBBER: Final = _ScrubExceptions()


def install_log_scrubber() -> None:
    """Scrub the exceptions aiohttp's server loggers log (idempotent; process-wide)."""
    for name in ("aiohttp.server", "aiohttp.web"):
        logger = logging.getLogger(name)
        if _SCRUBBER not in logger.filters:
            logger.addFilter(_SCRUBBER)
