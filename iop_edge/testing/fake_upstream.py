"""Machinery shared by the fake HTTP upstreams (:mod:`~iop_edge.testing.fake_openai`,
:mod:`~iop_edge.testing.fake_ollama`): behaviour choice, recording, counters, server lifecycle.

- :class:`~iop_edge.testing.fake_behavior.FakeBehavior` (in
  :mod:`~iop_edge.testing.fake_behavior`): what a fake does with one request, chosen per
  request by :class:`FakeUpstream` from its default, a queue, the ``x-fake-behavior`` header
  and a ``[[fake:...]]`` directive in the last user message.
- :class:`FakeUpstream`: the base class — lifecycle (async context manager on ``127.0.0.1``
  and a free port), :class:`RecordedRequest` recording, in-flight / completed / cancelled
  counting (:class:`FakeUpstreamStatistics`) and event-driven waits (``wait_in_flight`` ...).
  A protocol subclass adds its routes (``_add_routes``), its error body (``_error_response``)
  and its handlers, built from the protected helpers (``_generation``, ``_resolve``,
  ``_before_answer``, ``_stream``, ``_body``, ``_listing``).
- Reply shaping shared by the protocols: :func:`split_reply`, :func:`shape_reply`,
  :func:`message_text`, :func:`last_user_text`, :func:`count_words`, and the deterministic
  vectors of the embeddings endpoints, :func:`fake_embedding`.
- :func:`serve_main`: run any fake standalone (benchmarks).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import signal
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, Self

import orjson
from aiohttp import web

from iop_edge.testing.fake_behavior import (
    BEHAVIOR_HEADER,
    DEFAULT_BEHAVIOR,
    FakeBehavior,
    apply_directive,
    split_reply,  # re-exported: shared with fake_cli
)

__all__ = [
    "FakeUpstream",
    "FakeUpstreamStatistics",
    "RecordedRequest",
    "RejectedRequest",
    "count_words",
    "fake_embedding",
    "last_user_text",
    "message_text",
    "serve_main",
    "shape_reply",
    "split_reply",
]


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request as the fake received it.

    ``json`` is the parsed body (``None`` for a body-less or unparsable request); ``headers`` is
    case-insensitive; ``behavior`` is the behaviour the fake applied.
    """

    method: str
    path: str
    headers: Mapping[str, str]
    json: Any
    behavior: FakeBehavior


@dataclass(frozen=True, slots=True)
class FakeUpstreamStatistics:
    """A snapshot of a fake's counters, all about generation requests (not model listings).

    ``total_requests`` = ``completed`` + ``cancelled`` + ``in_flight``. ``cancelled`` counts
    requests whose handler was cancelled: the client went away (or the fake closed) first.
    ``max_open_connections``: the most connections open when a generation request arrived (its
    own included), a connection counting as open until the fake has finished with it — what a
    server that limits its connections sees.
    """

    total_requests: int
    in_flight: int
    max_in_flight: int
    completed: int
    cancelled: int
    max_open_connections: int = 0


class RejectedRequest(Exception):
    """Raised by a fake's handler to answer with the protocol's error body and ``status``."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


_GenerationHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class FakeUpstream:
    """Shared core of the fake upstreams: lifecycle, recording, counters and behaviour choice.

    Use as an async context manager (or :meth:`start` / :meth:`close`); it listens on
    ``host:port`` (default ``127.0.0.1`` and a free port) and :attr:`origin` tells where.

    **Behaviour of a generation request**, most specific last:

    1. :attr:`behavior`, the default, which may be reassigned at any time;
    2. else the next behaviour queued with :meth:`enqueue` (consumed by one request);
    3. then fields from the :data:`~iop_edge.testing.fake_behavior.BEHAVIOR_HEADER` header
       (``x-fake-behavior: status=500``);
    4. then fields from a directive in the last user message (``[[fake:fault=reset]]``).

    A malformed header or directive gets a 400 naming the field. Model listings honour only
    ``latency``, ``status`` and ``disconnect``, of :attr:`listing` then of the header.

    **Observation**: :attr:`requests` keeps the last ``record_limit`` requests of every kind;
    :attr:`in_flight`, :attr:`max_in_flight`, :attr:`total_requests`, :attr:`completed` and
    :attr:`cancelled` count generation requests; :attr:`open_connections` and
    :attr:`max_open_connections` count connections as the server sees them;
    :meth:`wait_until` and its shorthands (:meth:`wait_in_flight`, :meth:`wait_requests`,
    :meth:`wait_idle`) return as soon as the counters satisfy a condition, so tests never
    sleep.
    """

    def __init__(
        self,
        *,
        behavior: FakeBehavior = DEFAULT_BEHAVIOR,
        models: Sequence[str] = ("fake-model",),
        strict_models: bool = False,
        record_limit: int = 1000,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.behavior = behavior
        """The default behaviour; reassign it to change what later requests get."""
        self.listing = DEFAULT_BEHAVIOR
        """What model listings get (their ``latency``, ``status`` and ``disconnect``): reassign
        it to make a health check fail while generation still works."""
        self.models: tuple[str, ...] = tuple(models)
        """Models listed by the fake; with ``strict_models`` any other model gets a 404."""
        self.strict_models = strict_models
        self.requests: deque[RecordedRequest] = deque(maxlen=record_limit)
        """The last ``record_limit`` requests received, oldest first."""
        self.total_requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.completed = 0
        self.cancelled = 0
        self.max_open_connections = 0
        self._host = host
        self._port = port
        self._queued: deque[FakeBehavior] = deque()
        self._waiters: list[tuple[Callable[[], bool], asyncio.Future[None]]] = []
        self._gate = asyncio.Event()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._runner: web.AppRunner | None = None
        self._sequence = 0
        self.app = web.Application()
        """The aiohttp application, to mount elsewhere or run by other means."""
        self._add_routes(self.app.router)

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind the listener and start serving."""
        if self._runner is not None:
            raise RuntimeError("this fake upstream is already started")
        # handler_cancellation: a client that goes away cancels its handler, as it does an
        # upstream call of a real server, so in_flight drops and `cancelled` counts it.
        runner = web.AppRunner(
            self.app,
            handle_signals=False,
            access_log=None,
            handler_cancellation=True,
            shutdown_timeout=1.0,
        )
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._port)
        await site.start()
        self._runner = runner
        self._port = int(runner.addresses[0][1])

    async def close(self) -> None:
        """Stop serving: held, stalled and slow requests are cancelled, connections closed."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        for task in list(self._handlers):
            task.cancel()
        await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def port(self) -> int:
        """The bound TCP port (after :meth:`start`)."""
        if self._runner is None:
            raise RuntimeError("the fake upstream is not started")
        return self._port

    @property
    def origin(self) -> str:
        """``http://HOST:PORT`` of the running fake."""
        return f"http://{self._host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The URL a client of this protocol is configured with (here the origin)."""
        return self.origin

    # -- control -----------------------------------------------------------------------------

    def enqueue(self, *behaviors: FakeBehavior) -> None:
        """Queue behaviours for the next generation requests, one each, in order."""
        self._queued.extend(behaviors)

    def release(self) -> None:
        """Let every request currently parked by ``hold`` proceed; later ones park again."""
        self._gate.set()
        self._gate = asyncio.Event()

    def clear(self) -> None:
        """Forget recorded requests and restart the high-water mark from the current load."""
        self.requests.clear()
        self.max_in_flight = self.in_flight
        self.max_open_connections = self.open_connections

    def statistics(self) -> FakeUpstreamStatistics:
        """Return a snapshot of the counters."""
        return FakeUpstreamStatistics(
            total_requests=self.total_requests,
            in_flight=self.in_flight,
            max_in_flight=self.max_in_flight,
            completed=self.completed,
            cancelled=self.cancelled,
            max_open_connections=self.max_open_connections,
        )

    @property
    def open_connections(self) -> int:
        """Connections open now, as the fake's server counts them (one stays open until the
        fake has finished with it, its handler included)."""
        server = self._runner.server if self._runner is not None else None
        return len(server.connections) if server is not None else 0

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Return once ``predicate()`` is true; it is checked now and whenever a counter moves.

        Wrap in ``asyncio.timeout`` to bound the wait.
        """
        if predicate():
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((predicate, future))
        try:
            await future
        finally:
            if not future.done():
                future.cancel()

    async def wait_in_flight(self, count: int) -> None:
        """Return once at least ``count`` generation requests are in flight."""
        await self.wait_until(lambda: self.in_flight >= count)

    async def wait_requests(self, count: int) -> None:
        """Return once at least ``count`` generation requests have arrived in total."""
        await self.wait_until(lambda: self.total_requests >= count)

    async def wait_idle(self) -> None:
        """Return once no generation request is in flight."""
        await self.wait_until(lambda: self.in_flight == 0)

    def _notify(self) -> None:
        pending: list[tuple[Callable[[], bool], asyncio.Future[None]]] = []
        for predicate, future in self._waiters:
            if future.done():
                continue
            if predicate():
                future.set_result(None)
            else:
                pending.append((predicate, future))
        self._waiters = pending

    # -- protocol hooks (subclasses) ---------------------------------------------------------

    def _add_routes(self, router: web.UrlDispatcher) -> None:
        raise NotImplementedError

    def _error_response(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> web.Response:
        raise NotImplementedError

    # -- shared request handling -------------------------------------------------------------

    def _generation(self, handle: _GenerationHandler) -> _GenerationHandler:
        """Wrap a generation handler with counting and the 400 mapping of invalid requests."""

        async def tracked(request: web.Request) -> web.StreamResponse:
            task = asyncio.current_task()
            if task is not None:
                self._handlers.add(task)
            self.total_requests += 1
            self.in_flight += 1
            if self.in_flight > self.max_in_flight:
                self.max_in_flight = self.in_flight
            self.max_open_connections = max(self.max_open_connections, self.open_connections)
            if self._waiters:
                self._notify()
            try:
                try:
                    response = await handle(request)
                except RejectedRequest as exc:
                    response = self._error_response(
                        exc.status, exc.message, param=exc.param, code=exc.code
                    )
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            else:
                self.completed += 1
            finally:
                self.in_flight -= 1
                if task is not None:
                    self._handlers.discard(task)
                if self._waiters:
                    self._notify()
            return response

        return tracked

    async def _read_json(self, request: web.Request) -> dict[str, Any]:
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            self._record(request, None, DEFAULT_BEHAVIOR)
            raise RejectedRequest(
                400, f"We could not parse the JSON body of your request: {exc}."
            ) from exc
        if not isinstance(body, dict):
            self._record(request, body, DEFAULT_BEHAVIOR)
            raise RejectedRequest(400, "The request body must be a JSON object.")
        return body

    def _record(self, request: web.Request, body: Any, behavior: FakeBehavior) -> None:
        self.requests.append(
            RecordedRequest(request.method, request.path, request.headers, body, behavior)
        )

    def _resolve(self, request: web.Request, body: Any, prompt: str) -> tuple[FakeBehavior, str]:
        """Choose the behaviour of a generation request; return it and the prompt sans directive."""
        behavior = self._queued.popleft() if self._queued else self.behavior
        try:
            query = request.headers.get(BEHAVIOR_HEADER)
            if query:
                behavior = behavior.with_overrides(query)
            behavior, prompt = apply_directive(behavior, prompt)
        except ValueError as exc:
            self._record(request, body, behavior)
            raise RejectedRequest(
                400, f"Invalid fake behaviour: {exc}", param=BEHAVIOR_HEADER
            ) from exc
        self._record(request, body, behavior)
        return behavior, prompt

    def _check_model(self, model: object, *, not_found: str) -> str:
        if not isinstance(model, str) or not model:
            raise RejectedRequest(
                400,
                "Missing required parameter: 'model'.",
                param="model",
                code="missing_required_parameter",
            )
        if self.strict_models and model not in self.models:
            raise RejectedRequest(404, not_found.format(model=model), code="model_not_found")
        return model

    async def _before_answer(self, request: web.Request, behavior: FakeBehavior) -> bool:
        """Apply hold, latency and ``disconnect``; return False when the connection is gone."""
        if behavior.hold:
            await self._gate.wait()
        if behavior.latency:
            await asyncio.sleep(behavior.latency)
        if behavior.fault == "disconnect":
            _close_transport(request)
            return False
        return True

    def _next_id(self) -> int:
        self._sequence += 1
        return self._sequence

    async def _stream(
        self,
        request: web.Request,
        behavior: FakeBehavior,
        frames: Sequence[bytes],
        *,
        content_type: str,
        malformed: bytes,
        error: bytes,
        content_length: int | None = None,
    ) -> web.StreamResponse:
        """Write ``frames`` one write each, with the behaviour's delays and fault."""
        response = web.StreamResponse(headers={"Content-Type": content_type})
        if content_length is not None:
            response.content_length = content_length
        else:
            response.headers["Cache-Control"] = "no-cache"
        await response.prepare(request)
        fault_at = behavior.fault_after if behavior.fault is not None else -1
        if fault_at > len(frames):
            fault_at = len(frames)
        for index, frame in enumerate(frames):
            if index == fault_at:
                break
            delay = behavior.chunk_delay if index else behavior.first_chunk_delay
            if delay:
                await asyncio.sleep(delay)
            await response.write(frame)
        if fault_at < 0:
            return response
        if behavior.fault_after == 0 and behavior.first_chunk_delay:
            await asyncio.sleep(behavior.first_chunk_delay)
        if behavior.fault == "reset":
            _close_transport(request)
        elif behavior.fault == "stall":
            await asyncio.get_running_loop().create_future()  # until cancelled
        elif behavior.fault == "malformed":
            await response.write(malformed)
        elif behavior.fault == "error":
            await response.write(error)
        return response

    async def _body(
        self,
        request: web.Request,
        behavior: FakeBehavior,
        body: bytes,
        *,
        content_type: str,
    ) -> web.StreamResponse:
        """Send a non-streaming body, faithful to the behaviour's delay and fault."""
        if behavior.fault is None and not behavior.first_chunk_delay:
            return web.Response(body=body, content_type=content_type)
        if behavior.fault == "error":
            return self._failure(behavior, 500)
        middle = len(body) // 2
        if behavior.fault == "malformed":
            body = body[:middle]
            middle = len(body) // 2
        plain = replace(behavior, fault=None) if behavior.fault == "malformed" else behavior
        return await self._stream(
            request,
            plain,
            (body[:middle], body[middle:]),
            content_type=content_type,
            malformed=b"",
            error=b"",
            content_length=len(body),
        )

    def _failure(self, behavior: FakeBehavior, status: int | None = None) -> web.Response:
        response = self._error_response(
            status or behavior.status, behavior.error_message, code=behavior.error_code
        )
        if behavior.retry_after is not None:
            response.headers["Retry-After"] = behavior.retry_after
        return response

    async def _listing(self, request: web.Request, body: bytes) -> web.StreamResponse:
        """Answer a model listing, honouring :attr:`listing` and the header's latency, status
        and disconnect."""
        behavior = self.listing
        query = request.headers.get(BEHAVIOR_HEADER)
        if query:
            try:
                behavior = behavior.with_overrides(query)
            except ValueError as exc:
                self._record(request, None, behavior)
                return self._error_response(400, f"Invalid fake behaviour: {exc}")
        self._record(request, None, behavior)
        if behavior.latency:
            await asyncio.sleep(behavior.latency)
        if behavior.fault == "disconnect":
            _close_transport(request)
            return web.Response()
        if behavior.status != 200:
            return self._failure(behavior)
        return web.Response(body=body, content_type="application/json")


def _close_transport(request: web.Request) -> None:
    # Closing (FIN after what was written) rather than aborting: the client reliably receives
    # the frames written so far, then sees the body end early — what a crashed upstream does.
    transport = request.transport
    if transport is not None:
        transport.close()


def shape_reply(
    text: str, chunks: int | None, *, max_tokens: object, stop: object
) -> tuple[list[str], str]:
    """Cut ``text`` at the first stop sequence, split it, cap it at ``max_tokens`` chunks.

    Returns the pieces and the finish reason (``stop`` or ``length``).
    """
    stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else ()
    for sequence in stops:
        if isinstance(sequence, str) and sequence:
            index = text.find(sequence)
            if index >= 0:
                text = text[:index]
    pieces = split_reply(text, chunks)
    if isinstance(max_tokens, int) and 0 <= max_tokens < len(pieces):
        return pieces[:max_tokens], "length"
    return pieces, "stop"


def message_text(content: object) -> str:
    """Return the text of a message ``content``: a string or a list of ``text`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type", "text") == "text"
        )
    return ""


def last_user_text(messages: object) -> str:
    """Return the text of the last ``user`` message of a chat request ('' when none)."""
    if isinstance(messages, list):
        for message in reversed(messages):
            if isinstance(message, dict) and message.get("role") == "user":
                return message_text(message.get("content"))
    return ""


def count_words(messages: object) -> int:
    """Count whitespace-separated words over every message: the fakes' prompt token count."""
    if not isinstance(messages, list):
        return 0
    return sum(
        len(message_text(message.get("content")).split())
        for message in messages
        if isinstance(message, dict)
    )


FAKE_EMBEDDING_DIMENSIONS = 8
"""The length of a fake embedding when the request does not ask for ``dimensions``."""


def fake_embedding(text: str, dimensions: int = FAKE_EMBEDDING_DIMENSIONS) -> list[float]:
    """The fakes' embedding of ``text``: ``dimensions`` numbers in [-1, 1) drawn from the
    SHA-256 of the text (the same text always gets the same vector, different texts differ).
    Each is a multiple of 1/128, so it survives float32 (base64) encoding exactly."""
    seed = text.encode()
    raw = b""
    counter = 0
    while len(raw) < dimensions:
        raw += hashlib.sha256(seed + counter.to_bytes(4, "big")).digest()
        counter += 1
    return [(byte - 128) / 128 for byte in raw[:dimensions]]


def serve_main(fake_type: type[FakeUpstream], argv: Sequence[str] | None = None) -> None:
    """Run a fake standalone until SIGINT/SIGTERM; print its base URL on stdout first.

    Uses uvloop when it is installed. ``--behavior`` takes the same query string as
    :data:`~iop_edge.testing.fake_behavior.BEHAVIOR_HEADER`.
    """
    parser = argparse.ArgumentParser(description=f"Run {fake_type.__name__} standalone.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--behavior", default="", help="default behaviour, e.g. 'chunks=8'")
    parser.add_argument("--model", action="append", dest="models", help="model to list")
    options = parser.parse_args(argv)
    try:
        behavior = DEFAULT_BEHAVIOR.with_overrides(options.behavior)
    except ValueError as exc:
        parser.error(f"--behavior: {exc}")

    async def serve() -> None:
        fake = (
            fake_type(
                behavior=behavior, models=options.models, host=options.host, port=options.port
            )
            if options.models
            else fake_type(behavior=behavior, host=options.host, port=options.port)
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        async with fake:
            print(fake.base_url, flush=True)
            await stop.wait()

    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        asyncio.run(serve())
    else:
        uvloop.run(serve())
