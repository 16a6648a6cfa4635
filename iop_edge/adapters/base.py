"""The adapter seam: what the HTTP layer hands an upstream, and what it gets back
(SPEC §7); the builders are in :mod:`iop_edge.adapters.registry`.

An :class:`Executor` runs one :class:`UpstreamCall` on a provider (or a model route) and returns
an :class:`UpstreamReply` (non-streaming, or an upstream error status) or an
:class:`UpstreamStream` (complete OpenAI SSE frames). Every executor speaks OpenAI on its
output side whatever the upstream speaks: ``openai_compat`` relays, ``ollama`` and ``cli``
normalize. The one exception is an API an upstream serves natively
(:attr:`Executor.native_apis`): a ``messages`` or ``messages/count_tokens`` call is Anthropic
Messages in and out, a ``responses`` call OpenAI Responses, relayed by ``openai_compat``
(:mod:`iop_edge.adapters.anthropic_native`, :mod:`iop_edge.adapters.responses_native`).
:meth:`Executor.count_tokens` counts a chat body's input tokens with the upstream's own
tokenizer where there is one (``openai_compat``: vLLM's or llama.cpp's ``/tokenize``, see
:mod:`iop_edge.adapters.tokenize`); ``ollama`` and ``cli`` answer ``None``.
An :class:`ExecutorSet` holds every executor of one node: built in this process from the
node's payload, or reached over a remote node's link.

Failure contract, the same for every adapter:

- before a response starts (connection refused, DNS, timeout, malformed upstream reply, CLI
  spawn failure or non-zero exit): :class:`~iop_edge.errors.AdapterError` with code
  ``upstream_error`` (status 502) or ``upstream_timeout`` (504), raised by ``complete`` /
  ``open_stream``;
- after a stream started (reset, stall, malformed frame, an error reported in the stream, CLI
  crash): the same :class:`~iop_edge.errors.AdapterError` raised out of
  :attr:`UpstreamStream.frames` — the caller renders it for the client, unless its
  ``error_relayed`` says the upstream's own error event already reached the client (a native
  API's stream: the frames ended with it);
- an upstream's own HTTP error status (400–599) is not an exception: it comes back as an
  :class:`UpstreamReply` with that status and an OpenAI error envelope (a native API's: its
  body as it came); any other status but
  200 (1xx, 204, 205 and other 2xx, 3xx — redirects are not followed —, anything past 599) is
  an ``upstream_error`` naming the status;
- an endpoint the adapter cannot serve (``completions`` on ``ollama`` / ``cli``,
  ``embeddings`` on ``cli``) or a request field it cannot honour (``n > 1`` on ``ollama``):
  :class:`UnsupportedRequestError`, status 400, code ``invalid_request_error``, ``param`` the
  field, raised before any I/O (the request path routes ``completions`` and ``embeddings`` only
  to providers that serve them, so a client meets the endpoint case only through a model
  route).

``request_timeout_ms`` (merged execution field, :data:`DEFAULT_REQUEST_TIMEOUT_MS` when unset)
is one deadline for the whole exchange, from the call to the last frame: a stall between frames
hits it too, and so does a frame waiting for a client that does not take it (the consumer's
write is then cancelled: :attr:`UpstreamStream.timed_out` tells it so). A streamed call may
carry :class:`StreamBounds` (the provider's live ``first_token_timeout_ms`` and
``stream_idle_timeout_ms``): no first frame in time is an ``upstream_timeout`` that fails over
(raised by ``open_stream`` or by the first step of the frames, before anything reached the
client); a wait for the next frame past the idle bound is an ``upstream_timeout`` raised out of
the frames. A stream that fails in any way never ends with ``[DONE]`` or a chunk with a
``finish_reason``. Cancelling the awaiting task (client gone) aborts the upstream HTTP request or
kills the CLI process group; :meth:`UpstreamStream.aclose` does the same for a stream abandoned
mid-way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, Self

from iop_edge.errors import RequestCode, RequestError

if TYPE_CHECKING:
    from types import TracebackType

    # Type-only: registry imports this module (a runtime import back would be a cycle).
    from iop_edge.adapters.registry import AdapterStatistics
    from iop_edge.seams import ProbeResult

__all__ = [
    "DEFAULT_REQUEST_TIMEOUT_MS",
    "NO_NATIVE_APIS",
    "Endpoint",
    "Executor",
    "ExecutorSet",
    "StreamBounds",
    "UnsupportedRequestError",
    "UpstreamCall",
    "UpstreamReply",
    "UpstreamStream",
    "Usage",
]

DEFAULT_REQUEST_TIMEOUT_MS: Final = 600_000
"""``request_timeout_ms`` when neither the provider nor its adapter sets it: 10 minutes, long
enough for a slow local model writing a long answer, short enough that a hung upstream frees
its slot."""

Endpoint = Literal[
    "chat/completions",
    "completions",
    "embeddings",
    "messages",
    "messages/count_tokens",
    "responses",
]
"""The endpoint a call targets (the path under ``/v1``): OpenAI's, Anthropic Messages' or
OpenAI Responses' for a provider that serves them natively (``native_apis: [messages]``,
``[responses]``)."""

NO_NATIVE_APIS: Final[frozenset[str]] = frozenset()
"""The :attr:`Executor.native_apis` of an executor that speaks OpenAI alone."""


@dataclass(slots=True)
class Usage:
    """Token usage as the upstream reported it; ``None`` when it did not.

    ``estimated``: the counts are the edge's estimate, not the upstream's (a ``cli`` provider
    that reports none; see :mod:`iop_edge.adapters.cli`).
    """

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    estimated: bool = False


@dataclass(frozen=True, slots=True)
class StreamBounds:
    """A provider's bounds on a stream (live: read from the catalog per request).

    ``first_token_ms``: from the call to the upstream's first frame (an SSE event, an NDJSON
    line, a CLI's first piece of answer). ``idle_ms``: each wait for the next frame after
    that. ``None``: no such bound (``request_timeout_ms`` still bounds the whole exchange).
    Only streamed calls are bounded: a non-streamed answer has no first token before its whole
    body.
    """

    first_token_ms: int | None = None
    idle_ms: int | None = None


@dataclass(frozen=True, slots=True)
class UpstreamCall:
    """One request to execute on a provider (or a model route)."""

    endpoint: Endpoint
    body: dict[str, Any]
    """The client's request body (OpenAI's; Anthropic Messages' for a ``messages`` endpoint,
    a Responses request for ``responses``), generation policy already applied. Not
    modified."""
    target: str
    """The upstream model name: replaces ``body["model"]`` upstream."""
    stream: bool
    headers: Mapping[str, str]
    """Extra upstream headers (provider auth); never the client's own ``Authorization``."""
    request_id: str
    """The request's id: sent upstream (``x-request-id`` header; ``IOP_EDGE_REQUEST_ID`` in a
    CLI's environment) and used in the ids of normalized answers."""
    model: str = ""
    """The model id the client asked for (a model group or route id): the ``model`` of every
    answer, whatever the upstream calls its model. Empty: the target."""
    estimated_prompt_tokens: int | None = None
    """The edge's estimate of the input tokens (what a ``cli`` provider reports as usage)."""
    bounds: StreamBounds | None = None
    """The provider's stream bounds, for a streamed call (``None``: none set)."""

    @property
    def answer_model(self) -> str:
        """The ``model`` the client's answer shows."""
        return self.model or self.target


@dataclass(slots=True)
class UpstreamReply:
    """A non-streaming result, or an upstream error answered before any stream started.

    ``body`` is OpenAI-format JSON: a ``chat.completion`` / ``text_completion`` object with
    ``status`` 200, else an error envelope ``{"error": {"message", "type", "param", "code"}}``
    carrying the upstream's own status (400–599). For a ``messages`` endpoint it is Anthropic's:
    a Message (``model`` the answer's) or ``{"input_tokens": N}``, else the upstream's error
    body as it came; for ``responses`` a Response object (``model`` the answer's: what the
    edge keeps for ``previous_response_id``), else the upstream's error body as it came.
    ``detail`` says, for the edge's log only, what the upstream answered (its status line and
    the start of its body, which the client does not see when it was not an OpenAI error).
    ``retry_after``: the seconds a 429's ``Retry-After`` header asked for.
    """

    status: int
    body: bytes
    usage: Usage
    detail: str | None = None
    retry_after: float | None = None


@dataclass(slots=True)
class UpstreamStream:
    """A streaming result whose status (200) is known before any frame is relayed.

    ``frames`` yields bytes holding one or more complete SSE frames, ``b"data: {...}\\n\\n"``
    in OpenAI chunk format (what arrived together is relayed together, as one write), ending
    with ``b"data: [DONE]\\n\\n"``; it raises :class:`~iop_edge.errors.AdapterError` on
    a failure mid-stream. ``usage`` is filled in while the frames are consumed. (A ``messages``
    stream's frames are Anthropic's events, ``b"event: X\\ndata: {...}\\n\\n"``, ending with
    ``message_stop``; a ``responses`` stream's are OpenAI Responses' events, framed alike,
    ending with ``response.completed`` or ``response.incomplete``.)

    Always :meth:`aclose` it (or use ``async with``), whether or not the frames were consumed:
    that releases the upstream connection or kills the CLI process group.
    """

    status: int
    frames: AsyncIterator[bytes]
    usage: Usage
    closer: Callable[[], Awaitable[None]] = field(repr=False)
    """Releases what the stream holds; :meth:`aclose` awaits it once. Set by the adapter. It
    returns once the upstream call has really ended (its connection closed, its CLI process
    group reaped), so a slot released after it is free upstream too."""
    timed_out: Callable[[], bool] = field(default=lambda: False, repr=False)
    """Called by a consumer whose write of a frame was cancelled: True when the cancellation
    is the exchange's ``request_timeout_ms`` (the client took no data until the whole exchange
    ran out), and then it is withdrawn; False: an outside cancellation, to propagate."""
    final_response: Callable[[], bytes | None] = field(default=lambda: None, repr=False)
    """A ``responses`` stream's final Response object, as JSON: the ``response`` of its last
    event (``response.completed``, ``response.incomplete``, or ``response.failed`` before the
    frames raise; its ``status`` says which) as the client received it, ``model`` the
    client's — what the edge keeps for ``previous_response_id``. ``None`` until that event
    has been relayed, and for every other stream. (A non-streamed ``responses`` call's
    Response is its :class:`UpstreamReply`'s ``body``.)"""
    _closed: bool = field(default=False, init=False, repr=False)

    async def first(self) -> bytes:
        """The first frame (``b""`` for a stream without any). On a failure the stream is
        closed before the error propagates."""
        try:
            return await anext(self.frames, b"")
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        """Release the upstream connection / kill the CLI group; idempotent, safe mid-stream."""
        if self._closed:
            return
        self._closed = True
        await self.closer()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()


class Executor(Protocol):
    """Runs calls on one provider (or one adapter instance, for a model route)."""

    @property
    def native_apis(self) -> frozenset[str]:
        """The APIs besides OpenAI's that the upstream serves itself and this executor relays
        (the provider's ``native_apis``: ``{"messages"}`` takes the ``messages`` and
        ``messages/count_tokens`` endpoints, ``{"responses"}`` the ``responses`` endpoint);
        empty for every other executor."""
        ...

    async def complete(self, call: UpstreamCall) -> UpstreamReply:
        """Run a non-streaming call; raise :class:`~iop_edge.errors.AdapterError` on failure."""
        ...

    async def open_stream(self, call: UpstreamCall) -> UpstreamStream | UpstreamReply:
        """Start a streaming call: a stream, or the upstream's error status as a reply."""
        ...

    async def count_tokens(
        self,
        chat_body: dict[str, Any],
        target: str,
        headers: Mapping[str, str],
        request_id: str,
    ) -> int | None:
        """The input tokens of a chat body (``messages`` and ``tools``) by the upstream's own
        tokenizer for the model ``target``, sent with ``headers`` (provider auth) and
        ``request_id`` like a call; ``None`` when this upstream cannot count (the edge then
        estimates). Never raises but for a cancellation; takes no slot."""
        ...


class ExecutorSet(Protocol):
    """Every executor of one node, whether it runs in this process
    (:class:`~iop_edge.adapters.registry.AdapterSet`, built from the node's payload) or on a
    remote node over its link (:class:`iop_edge.link.remote.RemoteNode`): what the edge's
    :class:`~iop_edge.adapters.registry.NodeAdapters` asks, so that the request path,
    admission and failover do not know which it is."""

    node_id: str

    def for_provider(self, provider_id: str) -> Executor:
        """The executor of a provider of this node that has an enabled adapter of its type;
        :class:`KeyError` (naming the providers there are) otherwise."""
        ...

    def for_adapter(self, adapter_name: str) -> Executor:
        """The executor of an enabled adapter instance of this node (for a model route);
        :class:`KeyError` (naming the enabled adapters) otherwise."""
        ...

    async def probe(self, provider_id: str) -> ProbeResult:
        """Run a provider's health check (its ``health_check``): whether it is healthy, and
        if not, why."""
        ...

    def statistics(self) -> tuple[AdapterStatistics, ...]:
        """One snapshot per enabled adapter instance of this node, in configuration order."""
        ...

    async def aclose(self) -> None:
        """Release every backend (pooled connections, CLI process groups, a node link);
        idempotent. Calls still in flight fail with ``upstream_error``."""
        ...


class UnsupportedRequestError(RequestError):
    """The call asks for something this adapter cannot do, before any I/O: an endpoint it does
    not serve (``completions`` on ``ollama`` / ``cli``) or a request it cannot translate
    (no ``messages`` list, an image given by URL to Ollama). A client-request error like the
    others (``invalid_request_error``, 400): it is the client's request, not the upstream,
    that cannot be served, so it never counts as an upstream failure. ``param`` names the
    offending field when there is one; a field the adapter cannot honour has the code
    ``unsupported_parameter`` (OpenAI's)."""

    def __init__(
        self, message: str, *, param: str | None = None, code: RequestCode = "invalid_request_error"
    ) -> None:
        super().__init__(code, message, status=400, param=param)


class Backend(Protocol):
    """What an adapter instance shares between the executors built on it."""

    async def aclose(self) -> None:
        """Release pooled connections / kill process groups still running."""
        ...
