"""HTTP plumbing shared by the ``openai_compat`` and ``ollama`` adapters.

- :class:`HttpBackend`: one pooled :class:`aiohttp.ClientSession` per adapter instance, made
  on first use (a session needs a running loop; a payload is mapped without one). aiohttp's own
  timeouts are off: each exchange is bounded by one deadline (``request_timeout_ms``).
- :class:`HttpTarget`: where one executor sends its requests and how it names itself in errors.
- :func:`read_capped`, :func:`not_an_answer`: reading bodies within
  size caps; :func:`upstream_error` maps the third-party exceptions met on the way to
  :class:`~iop_edge.errors.AdapterError` (the adapters raise it once, ``from exc``).
- :func:`post_for_body`, :func:`post_for_stream`: one POST, bounded by the call's deadline;
  :func:`probe`, one health check, bounded by its own.
- Deadlines and exchanges live in :mod:`iop_edge.adapters.deadlines`; the one stream relay
  (:func:`~iop_edge.adapters.relay.relay_lines`) in :mod:`iop_edge.adapters.relay`.

Statuses: 200 is an answer; 400–599 is the upstream's own error, relayed with its status in
an OpenAI envelope (an upstream's OpenAI envelope as is; any other body — an HTML page from a
proxy — stays in the log, the client gets a sentence naming the provider), or with
``raw_errors`` (a native API's passthrough) with its body as it came, for the adapter to judge
(:func:`raw_error_reply`); anything else (1xx,
204, 205 and other 2xx, 3xx — redirects are never followed —, a status past 599) is an
``upstream_error`` (502) whose message, for the log, names what came back.

A cancelled or failed exchange closes (never pools) its connection, so the upstream sees the
client go at once; it ends only once that connection's socket is closed (aiohttp's ``close()``
only schedules it), so a slot released after it is free upstream too.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import functools
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson
from aiohttp.http_exceptions import HttpProcessingError
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from iop_edge.adapters.base import StreamBounds, UpstreamReply, Usage
from iop_edge.adapters.deadlines import Deadlines, Exchange
from iop_edge.envelope import envelope
from iop_edge.errors import AdapterError, FailureKind
from iop_edge.seams import Clock, ProbeResult

__all__ = [
    "MAX_RESPONSE_BYTES",
    "Deadlines",
    "Exchange",
    "HttpBackend",
    "HttpTarget",
    "ResponseTooLarge",
    "connection_closed",
    "connection_protocol",
    "exchange_failure",
    "not_an_answer",
    "probe",
    "raw_error_reply",
    "read_capped",
    "redact_url",
    "static_headers",
    "upstream_error",
]

MAX_RESPONSE_BYTES: Final = 32 * 1024 * 1024
"""Cap on a non-streaming upstream body (and an error body: only its first 64 KiB is kept)."""

_MAX_ERROR_BODY: Final = 64 * 1024
_MAX_ERROR_DETAIL: Final = 500
_MAX_PROBE_BODY: Final = 1024 * 1024
"""Characters of a non-OpenAI error body kept for the log line."""


class ResponseTooLarge(Exception):
    """An upstream body over :data:`MAX_RESPONSE_BYTES`."""


def redact_url(url: str) -> str:
    """``url`` without user:password, for messages and logs."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


@functools.lru_cache(maxsize=4096)
def parsed_url(url: str) -> URL:
    """``url`` parsed once: an executor posts to the same few URLs for its whole life, and
    aiohttp would parse a string on every request."""
    return URL(url)


class HttpBackend:
    """The connection pool of one HTTP adapter instance, shared by its providers."""

    def __init__(self, adapter_name: str) -> None:
        self.adapter_name = adapter_name
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    def session(self) -> aiohttp.ClientSession:
        """The pooled session, created on first use inside the running loop."""
        if self._closed:
            raise AdapterError(
                "upstream_error",
                f"adapter {self.adapter_name!r} is closed (the node's adapters were replaced or "
                "the daemon is stopping); the call was not sent",
                failure=None,
            )
        session = self._session
        if session is None:
            # No connection limit here: admission (provider capacity) bounds concurrency, and a
            # hidden connector limit would queue requests that already hold a slot.
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
            session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=None, sock_read=None),
                raise_for_status=False,
            )
            self._session = session
        return session

    async def aclose(self) -> None:
        """Close the pool; idempotent. Later calls fail with ``upstream_error``."""
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()


@dataclass(frozen=True, slots=True)
class HttpTarget:
    """One executor's upstream: its base URL, static headers, deadline and name in errors."""

    label: str
    """E.g. ``openai_compat provider 'vllm-a' (adapter 'vllm-main')``."""
    base_url: str | None
    headers: CIMultiDictProxy[str]
    timeout_ms: int
    clock: Clock | None = field(default=None, repr=False, compare=False)
    """The clock of the deadlines (the daemon's; the loop's when None)."""
    deadlines: Deadlines = field(init=False, repr=False, compare=False)
    """Bounds each exchange by ``timeout_ms``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "deadlines", Deadlines(self.timeout_ms, self.clock))

    def url(self, path: str) -> str:
        """``base_url`` joined with ``path``, or a clear error when no base_url is configured."""
        if self.base_url is None:
            raise AdapterError(
                "upstream_error",
                f"{self.label} has no base_url; set base_url on the provider or its adapter",
            )
        return f"{self.base_url}/{path.lstrip('/')}"

    def request_headers(self, extra: Mapping[str, str], request_id: str = "") -> CIMultiDict[str]:
        """Content-Type, then the configured ``headers``, then the call's (later wins), then
        ``x-request-id`` (the edge's request id, when given)."""
        merged: CIMultiDict[str] = CIMultiDict(self.headers)
        for name, value in extra.items():
            merged[name] = value
        if request_id:
            merged["x-request-id"] = request_id
        return merged

    def broken(self, url: str, reason: str) -> AdapterError:
        """The ``upstream_error`` for an answer that breaks the protocol (an operator reads it)."""
        return AdapterError(
            "upstream_error", f"{self.label} at POST {redact_url(url)} failed: {reason}"
        )


def static_headers(configured: Mapping[str, str] | None) -> CIMultiDictProxy[str]:
    """The headers every request of an executor carries: JSON content type, then config."""
    headers: CIMultiDict[str] = CIMultiDict({"Content-Type": "application/json"})
    for name, value in (configured or {}).items():
        headers[name] = value
    return CIMultiDictProxy(headers)


def upstream_error(
    target: HttpTarget,
    url: str,
    exc: BaseException,
    *,
    answered: bool = True,
    method: str = "POST",
) -> AdapterError:
    """Map an exception met while talking to ``url`` to the adapter error an operator reads.

    ``answered``: the response head had arrived. Before it, a connection failure or the
    timeout may fail over to another provider (``failover``); after it, nothing does.
    """
    where = f"{target.label} at {method} {redact_url(url)}"
    if isinstance(exc, AdapterError):
        return exc
    if isinstance(exc, TimeoutError):
        return AdapterError(
            "upstream_timeout",
            f"{where} did not finish within request_timeout_ms={target.timeout_ms}",
            status=504,
            failure="timeout",
            failover=not answered,
        )
    if isinstance(exc, aiohttp.ClientConnectionError | ConnectionError) and not isinstance(
        exc, aiohttp.ClientPayloadError
    ):
        # Never sent (no connection: refused, DNS, TLS) or sent and dropped: only the first
        # is sure to have done no work upstream (retry_on's connect / timeout_before_head).
        kind: FailureKind = "dropped"
        if isinstance(exc, aiohttp.ClientConnectorError):
            kind, reason = "connect", f"cannot connect: {exc.os_error.strerror or exc.os_error}"
        elif isinstance(exc, aiohttp.ServerDisconnectedError):
            reason = "the upstream closed the connection before answering"
        else:
            reason = f"the connection failed ({type(exc).__name__}: {exc})"
        return AdapterError(
            "upstream_error",
            f"{where} failed: {reason}",
            failure=kind,
            failover=not answered,
        )
    if isinstance(exc, aiohttp.ClientPayloadError):
        reason = f"the response body was cut short ({exc})"
    elif isinstance(exc, HttpProcessingError):
        reason = f"the response is not valid HTTP or exceeds a size limit ({exc.message})"
    elif isinstance(exc, ResponseTooLarge):
        reason = str(exc)
    elif isinstance(exc, orjson.JSONDecodeError):
        reason = f"the response is not valid JSON ({exc})"
    else:
        reason = f"{type(exc).__name__}: {exc}"
    return AdapterError("upstream_error", f"{where} failed: {reason}", status=502)


def exchange_failure(
    exchange: Exchange, target: HttpTarget, url: str, exc: BaseException
) -> AdapterError:
    """The error for ``exc`` met in ``exchange``: the timeout of the bound that passed, once
    one has, else the mapped one (an AdapterError is itself)."""
    answered = exchange.response is not None
    if exchange.expired is not None:
        where = f"{target.label} at POST {redact_url(url)}"
        return exchange.timeout_error(where, answered=answered)
    return upstream_error(target, url, exc, answered=answered)


async def connection_closed(protocol: Any) -> None:
    """Wait until the connection of ``protocol`` (an aiohttp response's, taken before it was
    closed) has its socket closed: ``close()`` only schedules that. Bounded: a transport that
    still has a request body to send waits for it forever."""
    closed = protocol.closed if protocol is not None else None
    if closed is None:  # (already closed)
        return
    await asyncio.wait((closed,), timeout=_CLOSE_WAIT_SECONDS)
    if closed.done() and not closed.cancelled():
        closed.exception()  # (retrieved: a connection lost with an error is no news here)


async def _closed_before_head() -> None:
    """An exchange that ended before its response head: aiohttp closed the connection itself
    (its protocol is not ours to wait on). Its socket is closed at once (uvloop) or by a
    callback already queued for the loop's next turn (asyncio): one turn, and it is closed."""
    await asyncio.sleep(0)


def connection_protocol(response: aiohttp.ClientResponse) -> Any:
    """The protocol of ``response``'s connection (to wait on with :func:`connection_closed`
    once the response is closed), or None when it has none."""
    connection = response.connection
    return connection.protocol if connection is not None else None


async def read_capped(response: aiohttp.ClientResponse, limit: int = MAX_RESPONSE_BYTES) -> bytes:
    """Read the whole body, refusing one larger than ``limit`` bytes."""
    declared = response.content_length
    if declared is not None and declared > limit:
        raise ResponseTooLarge(f"the body is {declared} bytes, over the {limit}-byte limit")
    chunks: list[bytes] = []
    size = 0
    while chunk := await response.content.readany():
        size += len(chunk)
        if size > limit:
            raise ResponseTooLarge(f"the body exceeds the {limit}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


#: How long an abandoned exchange waits for its connection's socket to close.
_CLOSE_WAIT_SECONDS: Final = 2.0


async def error_reply(response: aiohttp.ClientResponse, label: str) -> UpstreamReply:
    """The upstream's error status (400–599) as an :class:`UpstreamReply` in the OpenAI
    envelope, with a ``detail`` for the log.

    An upstream that already answers with an OpenAI envelope is passed through as is, and
    Ollama's ``{"error": "text"}`` becomes one; any other body (HTML from a proxy, plain text)
    is not shown to the client — it may be a whole page, or echo internals — only the start of
    it goes to the log.
    """
    status, reason = response.status, response.reason or ""
    retry_after = parse_retry_after(response.headers.get("Retry-After")) if status == 429 else None
    raw = await read_capped_prefix(response, _MAX_ERROR_BODY)
    parsed: Any = None
    with contextlib.suppress(orjson.JSONDecodeError):
        parsed = orjson.loads(raw)
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        detail = f"the upstream answered {status} {reason}: {_excerpt(error['message'])}"
        return UpstreamReply(status, raw, Usage(), detail, retry_after)
    if isinstance(error, str) and error:
        detail = f"the upstream answered {status} {reason}: {_excerpt(error)}"
        body = envelope(error, None, status=status)
        return UpstreamReply(status, body, Usage(), detail, retry_after)
    text = _excerpt(raw.decode("utf-8", errors="replace"))
    body = envelope(
        f"The upstream of {label} answered HTTP {status} with a body that is not an OpenAI "
        "error; the edge's log has it under this request's x-request-id.",
        "upstream_error",
        status=status,
    )
    detail = f"the upstream answered {status} {reason}: {text or '(empty body)'}"
    return UpstreamReply(status, body, Usage(), detail, retry_after)


def parse_retry_after(value: str | None) -> float | None:
    """Seconds a ``Retry-After`` header asks for (delta-seconds or an HTTP date), or ``None``
    when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(int(value[:9]))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - time.time())


def _excerpt(text: str) -> str:
    """At most :data:`_MAX_ERROR_DETAIL` characters of ``text`` on one line."""
    flat = " ".join(text.split())
    return flat if len(flat) <= _MAX_ERROR_DETAIL else flat[: _MAX_ERROR_DETAIL - 3] + "..."


async def raw_error_reply(response: aiohttp.ClientResponse) -> UpstreamReply:
    """The upstream's error status (400–599) as an :class:`UpstreamReply` whose body is the
    upstream's as it came (its first 64 KiB), with a ``detail`` for the log (the ``message``
    of a JSON error object, else the start of the body) and ``retry_after`` as for
    :func:`error_reply`. What the client may see of a body that is not the API's error is the
    adapter's call."""
    status, reason = response.status, response.reason or ""
    retry_after = parse_retry_after(response.headers.get("Retry-After")) if status == 429 else None
    raw = await read_capped_prefix(response, _MAX_ERROR_BODY)
    said = raw.decode("utf-8", errors="replace")
    with contextlib.suppress(orjson.JSONDecodeError):
        parsed = orjson.loads(raw)
        error = parsed.get("error") if isinstance(parsed, dict) else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            said = error["message"]
    answered = f"{status} {reason}".rstrip()
    detail = f"the upstream answered {answered}: {_excerpt(said) or '(empty body)'}"
    return UpstreamReply(status, raw, Usage(), detail, retry_after)


async def not_an_answer(
    target: HttpTarget, url: str, response: aiohttp.ClientResponse, *, raw_errors: bool = False
) -> UpstreamReply:
    """A status other than 200: the upstream's own error (400–599) as an
    :class:`UpstreamReply` (its body as it came with ``raw_errors``, else in the OpenAI
    envelope); anything else raises ``upstream_error`` naming the status."""
    if 400 <= response.status <= 599:
        if raw_errors:
            return await raw_error_reply(response)
        return await error_reply(response, target.label)
    reason = _excerpt(response.reason or "")[:80]
    raise target.broken(
        url,
        f"it answered HTTP {response.status} {reason}".rstrip()
        + "; the edge relays only 200 (an answer) or 400-599 (an error), and never follows "
        "a redirect",
    )


async def read_capped_prefix(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """Up to ``limit`` bytes of the body; the rest is dropped with the connection."""
    chunks: list[bytes] = []
    size = 0
    while size < limit and (chunk := await response.content.readany()):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)[:limit]


async def probe(
    backend: HttpBackend, target: HttpTarget, path: str, deadlines: Deadlines
) -> ProbeResult:
    """One health check: ``GET {base_url}{path}`` with the target's configured headers;
    healthy on a 2xx answer within the ``deadlines``' timeout (the check's ``timeout_ms``).
    Never raises (but for a cancellation)."""
    url = target.url(path.lstrip("/"))
    where = f"{target.label}: the health check GET {redact_url(url)}"
    late = f"{where} did not answer within {deadlines.timeout_ms} ms"
    exchange = deadlines.start()
    response: aiohttp.ClientResponse | None = None
    try:
        response = exchange.response = await backend.session().get(
            parsed_url(url), headers=target.headers, allow_redirects=False
        )
        status = response.status
        await read_capped_prefix(response, _MAX_PROBE_BODY)
    except asyncio.CancelledError:
        if exchange.timed_out():
            return False, late
        raise
    except AdapterError as exc:
        return False, str(exc)
    except (aiohttp.ClientError, OSError) as exc:
        if exchange.expired is not None:  # the deadline closed the response under the read
            return False, late
        return False, str(upstream_error(target, url, exc, answered=False, method="GET"))
    finally:
        exchange.end()
        if response is not None:
            response.close()
    if exchange.expired is not None:  # (a body cut by the deadline may read as its end)
        return False, late
    if 200 <= status < 300:
        return True, None
    return False, f"{where} answered HTTP {status}"


def _send(
    backend: HttpBackend,
    target: HttpTarget,
    url: str,
    payload: bytes,
    extra: Mapping[str, str],
    request_id: str,
) -> Any:
    """The POST of an exchange, to be awaited for the response head (a plain call, not a
    coroutine: no frame of its own on the request path)."""
    return backend.session().post(
        parsed_url(url),
        data=payload,
        headers=target.request_headers(extra, request_id),
        allow_redirects=False,
    )


async def post_for_body(
    backend: HttpBackend,
    target: HttpTarget,
    url: str,
    payload: bytes,
    extra: Mapping[str, str],
    request_id: str = "",
    *,
    raw_errors: bool = False,
) -> bytes | UpstreamReply:
    """POST ``payload`` and read the whole body of a 200; an upstream error status (400–599)
    comes back as an :class:`UpstreamReply` in the OpenAI envelope (as it came, with
    ``raw_errors``). Failures — any other status included — raise the mapped AdapterError.
    One :class:`Exchange` bounds it all.

    Whatever happens the response is let go: a body read to the end goes back to the pool,
    anything else (a cancelled caller, a timeout) aborts the connection, so the upstream sees
    the client leave at once.
    """
    exchange = target.deadlines.start()
    finished = False
    response: aiohttp.ClientResponse | None = None
    try:
        response = exchange.response = await _send(backend, target, url, payload, extra, request_id)
        if response.status != 200:
            reply = await not_an_answer(target, url, response, raw_errors=raw_errors)
            finished = True
            return reply
        raw = await read_capped(response)
        finished = True
        return raw
    except AdapterError:
        raise
    except asyncio.CancelledError:
        if exchange.timed_out():
            raise exchange_failure(exchange, target, url, TimeoutError()) from None
        raise
    except Exception as exc:
        raise exchange_failure(exchange, target, url, exc) from exc
    finally:
        exchange.end()
        if response is not None:
            if finished:
                response.release()
            else:
                protocol = connection_protocol(response)
                response.close()
                await connection_closed(protocol)
        else:
            await _closed_before_head()


async def post_for_stream(
    backend: HttpBackend,
    target: HttpTarget,
    url: str,
    payload: bytes,
    extra: Mapping[str, str],
    request_id: str = "",
    bounds: StreamBounds | None = None,
    *,
    raw_errors: bool = False,
) -> tuple[aiohttp.ClientResponse, Exchange] | UpstreamReply:
    """POST ``payload`` for a streamed answer: the open 200 response (the caller reads it
    through :func:`relay_lines`, which ends the exchange) with its :class:`Exchange` (under
    the call's stream ``bounds`` too), or the upstream's error status (400–599) as an
    :class:`UpstreamReply` (its body as it came with ``raw_errors``); any other status
    raises ``upstream_error``."""
    exchange = target.deadlines.start(bounds)
    response: aiohttp.ClientResponse | None = None
    try:
        response = exchange.response = await _send(backend, target, url, payload, extra, request_id)
        if response.status != 200:
            reply = await not_an_answer(target, url, response, raw_errors=raw_errors)
            response.release()
            exchange.end()
            return reply
    except BaseException as exc:
        exchange.end()
        if response is not None:
            protocol = connection_protocol(response)
            response.close()
            await connection_closed(protocol)
        else:
            await _closed_before_head()
        if isinstance(exc, asyncio.CancelledError) and exchange.timed_out():
            raise exchange_failure(exchange, target, url, TimeoutError()) from None
        if isinstance(exc, Exception) and not isinstance(exc, AdapterError):
            raise exchange_failure(exchange, target, url, exc) from exc
        raise
    return response, exchange
