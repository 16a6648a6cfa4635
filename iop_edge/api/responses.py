"""The OpenAI Responses surface: ``POST /v1/responses`` (Codex, the Agents SDK), and
``GET`` / ``DELETE /v1/responses/{id}`` of the responses the edge stored.

A request is translated into the internal form by the pure core
(:func:`iop_edge.translate.responses_request.translate_responses`) and goes the one request path
(:mod:`iop_edge.api.request_path`) as a chat request would. Each attempt is translated (its chat
answer rendered as a Response, or as Responses' event stream) or, on an ``openai_compat``
provider with ``native_apis: [responses]``, passed through (the body untouched but for
``model``, the generation policy and the conversation a ``previous_response_id`` names).

**State.** Unless the request says ``store: false``, the finished response is kept in the
edge's bounded store (:mod:`iop_edge.api.responses_store`, ``openai.responses_store``) with the
conversation up to it — its input items (after the history it continued) and its output items —
so that ``previous_response_id`` continues it and ``GET`` / ``DELETE /v1/responses/{id}``
answer. A response is visible only to the principal that created it: any other, and an id that
is unknown, expired or from before a restart, is the same 404 ``response_not_found``.
``previous_response_id`` is resolved by the edge on every provider (the stored items are put
before the request's input), so a conversation started on one provider continues on any other,
translated or passed through; it is never sent upstream.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Final

import orjson

from iop_edge.adapters.base import Endpoint, UpstreamReply
from iop_edge.api.auth import ANONYMOUS, Principal
from iop_edge.api.bodies import decode_json_object
from iop_edge.api.responses_store import ResponsesStore
from iop_edge.api.translated import translated_frames
from iop_edge.envelope import envelope
from iop_edge.errors import RequestError
from iop_edge.translate.chat_events import decode_completion
from iop_edge.translate.chat_request import InternalRequest, apply_reasoning
from iop_edge.translate.responses_reply import output_items, render_response
from iop_edge.translate.responses_request import ResponsesRequest, translate_responses
from iop_edge.translate.responses_stream import ResponsesStreamTranslator
from iop_edge.translate.sse import dumps, encode_event

__all__ = [
    "RESPONSES_API",
    "PassthroughRenderer",
    "ResponsesRenderer",
    "ResponsesSurface",
    "SurfaceResponsesRequest",
    "not_stored",
    "owner_of",
    "untranslated",
]

#: the ``native_apis`` name of the OpenAI Responses API
RESPONSES_API: Final = "responses"
# Response ids: a random per-process prefix and a counter (unique without a system call).
_ID_PREFIX: Final = os.urandom(6).hex()
_ID_COUNTER: Final = itertools.count(1)


def owner_of(principal: Principal | None) -> str:
    """Whose a stored response is: its principal's ref (``anonymous`` on an open edge)."""
    return (principal or ANONYMOUS).principal_ref


def not_stored(response_id: str, param: str | None = None) -> RequestError:
    """The 404 for a response the caller cannot see (never saying which of the reasons)."""
    return RequestError(
        "response_not_found",
        f"No response with id '{response_id:.200}' is stored on this edge for you: it is "
        "unknown, expired (openai.responses_store.ttl_ms), was deleted or evicted, belongs to "
        "another principal, or was created before the edge last restarted (the store is kept "
        "in memory).",
        status=404,
        param=param,
    )


def untranslated(body: Mapping[str, Any], raw: bytes, refusal: RequestError) -> ResponsesRequest:
    """What the request path needs of a body only passthrough can take (a built-in tool, say):
    its model, stream, ``store``, token limit and input items (each checked as the translation
    checks it; else ``refusal`` is raised), and one message of its whole text, so that it is
    estimated by its size. Never sent upstream: an attempt that would translate it raises
    ``refusal``."""
    model, stream, store = body.get("model"), body.get("stream"), body.get("store")
    given = body.get("input")
    limit = body.get("max_output_tokens")
    if (
        not isinstance(model, str)
        or not model
        or not isinstance(stream, bool | None)
        or not isinstance(store, bool | None)
        or not isinstance(given, str | list)
        or (limit is not None and (type(limit) is not int or limit < 1))
    ):
        raise refusal
    items: list[dict[str, Any]] = (
        [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": given}]}]
        if isinstance(given, str)
        else [item for item in given if isinstance(item, dict)]
    )
    chat: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": raw.decode("utf-8", "replace")}],
    }
    if limit is not None:
        chat["max_tokens"] = limit
    if stream:
        chat["stream"] = True
    internal = InternalRequest(chat, model, bool(stream), None, (), ())
    previous = body.get("previous_response_id")
    return ResponsesRequest(
        internal,
        tuple(items),
        store is not False,
        previous if isinstance(previous, str) else None,
        None,
        {},
    )


class ResponsesRenderer:
    """An attempt on a provider that does not speak Responses: the adapter's chat answer as a
    Response, or as Responses' event stream; the finished response stored (see
    :class:`~iop_edge.api.surface.Renderer`)."""

    __slots__ = ("_estimate", "_id", "_request", "_translator")

    def __init__(self, request: SurfaceResponsesRequest, estimated_input_tokens: int) -> None:
        self._request = request
        self._estimate = estimated_input_tokens
        self._id = f"resp_{_ID_PREFIX}{next(_ID_COUNTER):018x}"
        self._translator: ResponsesStreamTranslator | None = None

    def render_reply(self, reply: UpstreamReply) -> bytes:
        """A 200's chat completion as a Response (stored); an error status as it came (the
        adapter's OpenAI envelope)."""
        if reply.status >= 400:
            return reply.body
        request = self._request
        response = render_response(
            decode_completion(reply.body),
            response_id=self._id,
            created_at=request.created_at,
            model=request.translated.internal.model,
            echo=request.translated.echo,
            estimated_input_tokens=self._estimate,
            include=request.translated.include,
        )
        body = dumps(response)
        request.keep(self._id, body, response)
        return body

    def render_stream(
        self, first: bytes, frames: AsyncIterator[bytes]
    ) -> tuple[bytes, AsyncIterator[bytes]]:
        """The chat frames as Responses' events, as they come; stored at the end."""
        request = self._request
        translator = self._translator = ResponsesStreamTranslator(
            response_id=self._id,
            created_at=request.created_at,
            model=request.translated.internal.model,
            echo=request.translated.echo,
            estimated_input_tokens=self._estimate,
            include=request.translated.include,
        )

        def finished() -> None:
            response, body = translator.response, translator.response_json
            if response is not None and body is not None:
                request.keep(self._id, body, response)  # (as the last event carried it)

        return translator.feed(first), translated_frames(translator, frames, finished)

    def render_stream_error(self, message: str, code: str, status: int) -> bytes:
        """``response.failed`` (never ``response.completed``), or OpenAI's ``error`` event
        before the stream began."""
        if self._translator is None:
            return _error_event(code, message)
        return self._translator.fail(code, message)

    def render_stream_reply(self, reply: UpstreamReply) -> bytes:
        """Never called (no keep-alive)."""
        return _error_event("upstream_error", f"The upstream answered HTTP {reply.status}.")

    def stream_finished(self, final_response: Callable[[], bytes | None]) -> None:
        """Nothing: the translation stored the response at its end."""


def _error_event(code: str, message: str) -> bytes:
    """OpenAI's stream ``error`` event."""
    return encode_event("error", {"type": "error", "code": code, "message": message, "param": None})


class PassthroughRenderer:
    """An attempt on a provider that speaks Responses: its answer as it came (the adapter set
    ``model``); the finished Response stored under the upstream's own id."""

    __slots__ = ("_request",)

    def __init__(self, request: SurfaceResponsesRequest) -> None:
        self._request = request

    def render_reply(self, reply: UpstreamReply) -> bytes:
        """The upstream's body (a 200's Response stored)."""
        if reply.status == 200:
            self._keep(reply.body)
        return reply.body

    def render_stream(
        self, first: bytes, frames: AsyncIterator[bytes]
    ) -> tuple[bytes, AsyncIterator[bytes]]:
        """The upstream's events."""
        return first, frames

    def render_stream_error(self, message: str, code: str, status: int) -> bytes:
        """OpenAI's ``error`` event (the upstream failed without an event of its own)."""
        return _error_event(code, message)

    def render_stream_reply(self, reply: UpstreamReply) -> bytes:
        """Never called (no keep-alive)."""
        return _error_event("upstream_error", f"The upstream answered HTTP {reply.status}.")

    def stream_finished(self, final_response: Callable[[], bytes | None]) -> None:
        """Store the Response the upstream's last event carried."""
        if self._request.stores:
            body = final_response()
            if body is not None:
                self._keep(body)

    def _keep(self, body: bytes) -> None:
        if self._request.stores:
            response = orjson.loads(body)
            if isinstance(response, dict) and isinstance(response.get("id"), str):
                self._request.keep(response["id"], body, response)


class SurfaceResponsesRequest:
    """A parsed ``/v1/responses`` request (see :class:`~iop_edge.api.surface.SurfaceRequest`)."""

    __slots__ = ("_raw", "_store", "created_at", "history", "owner", "refusal", "translated")

    native_api: Final = RESPONSES_API
    keepalive: Final = None

    def __init__(
        self,
        raw: dict[str, Any],
        translated: ResponsesRequest,
        history: Sequence[Mapping[str, Any]],
        owner: str,
        store: ResponsesStore | None,
        created_at: int,
        refusal: RequestError | None = None,
    ) -> None:
        self._raw = raw
        self.translated = translated
        self.history = history
        self.owner = owner
        self._store = store if translated.store else None
        self.created_at = created_at
        self.refusal = refusal

    @property
    def body(self) -> dict[str, Any]:
        """The chat body."""
        return self.translated.internal.chat

    @property
    def stores(self) -> bool:
        """Whether its response is kept (not ``store: false``, and a store exists)."""
        return self._store is not None

    def keep(self, response_id: str, body: bytes, response: Mapping[str, Any]) -> None:
        """Store a finished response with its conversation (unless ``store: false``)."""
        if self._store is None:
            return
        items = [*self.history, *self.translated.input_items, *output_items(response)]
        self._store.put(response_id, self.owner, body, items)

    def native_body(self, policy: Mapping[str, Any]) -> dict[str, Any]:
        """The client's body with the generation policy, and the stored conversation before
        its input (``previous_response_id`` is the edge's, never sent upstream)."""
        body = dict(self._raw)
        max_tokens = policy.get("max_tokens")
        if max_tokens is not None:
            body["max_output_tokens"] = max_tokens
        if self.history:
            body.pop("previous_response_id", None)
            body["input"] = [*self.history, *self.translated.input_items]
        return body

    def native_headers(self) -> Mapping[str, str]:
        """None: the Responses API has no version header."""
        return {}

    def renderer(
        self, *, native: bool, estimated_input_tokens: int
    ) -> ResponsesRenderer | PassthroughRenderer:
        """The passthrough renderer, or a translating one for this request."""
        if native:
            return PassthroughRenderer(self)
        return ResponsesRenderer(self, estimated_input_tokens)


class ResponsesSurface:
    """``POST /v1/responses`` (see :class:`~iop_edge.api.surface.Surface`), on the edge's store
    (read through ``store``: the current one, replaced by a refresh)."""

    __slots__ = ("_store", "_wall_clock")

    name: Final = "responses"
    endpoint: Final[Endpoint] = "chat/completions"

    def __init__(
        self,
        store: Callable[[], ResponsesStore | None],
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._wall_clock = wall_clock

    def parse(
        self, raw: bytes, headers: Mapping[str, str], principal: Principal | None
    ) -> SurfaceResponsesRequest:
        """The body translated into the internal form, after the conversation its
        ``previous_response_id`` names (a 404 when the caller has no such response)."""
        body = decode_json_object(raw)
        owner = owner_of(principal)
        store = self._store()
        history: Sequence[Mapping[str, Any]] = ()
        previous = body.get("previous_response_id")
        if previous is not None:
            if not isinstance(previous, str) or not previous:
                raise RequestError(
                    "invalid_request_error",
                    f"previous_response_id: {previous!r:.80} is not a response id (a string).",
                    param="previous_response_id",
                )
            stored = store.get(previous, owner) if store is not None else None
            if stored is None:
                raise not_stored(previous, "previous_response_id")
            history = stored.items
        try:
            translated = translate_responses(body, history)
        except RequestError as exc:  # (a provider that speaks Responses may still take it)
            return SurfaceResponsesRequest(
                body,
                untranslated(body, raw, exc),
                history,
                owner,
                store,
                int(self._wall_clock()),
                exc,
            )
        apply_reasoning(translated.internal.chat, translated.internal.reasoning)
        return SurfaceResponsesRequest(
            body, translated, history, owner, store, int(self._wall_clock())
        )

    render_error = staticmethod(envelope)
    """The OpenAI error envelope."""

    def error_status(self, code: str | None, status: int) -> int:
        """The edge's own status (:mod:`iop_edge.api.errors`)."""
        return status

    def __repr__(self) -> str:
        return "ResponsesSurface()"


def stored_body(store: ResponsesStore | None, response_id: str, owner: str) -> bytes:
    """``GET /v1/responses/{id}``: the stored response as the client got it (404 otherwise)."""
    stored = store.get(response_id, owner) if store is not None else None
    if stored is None:
        raise not_stored(response_id)
    return stored.response


def deleted_body(store: ResponsesStore | None, response_id: str, owner: str) -> bytes:
    """``DELETE /v1/responses/{id}``: OpenAI's deletion object (404 when there was none)."""
    if store is None or not store.delete(response_id, owner):
        raise not_stored(response_id)
    return orjson.dumps({"id": response_id, "object": "response.deleted", "deleted": True})
