"""Anthropic Messages as an OpenAI-compatible server speaks it natively (vLLM, llama.cpp, Ollama
do): the routes :class:`~iop_edge.testing.fake_openai.FakeOpenAI` serves besides OpenAI's.

- ``POST /v1/messages``: a Message (``{"id", "type": "message", "role": "assistant", "model",
  "content", "stop_reason", "stop_sequence", "usage"}``), or with ``"stream": true`` its event
  stream, each event one frame ``event: <type>\\ndata: <json>\\n\\n``, in Anthropic's grammar:
  ``message_start`` (empty content, ``usage.input_tokens``), ``ping``, then per content block
  ``content_block_start`` / ``content_block_delta``... / ``content_block_stop`` with its
  ``index``, then ``message_delta`` (``stop_reason``, ``stop_sequence``,
  ``usage.output_tokens``) and ``message_stop``.
- ``POST /v1/messages/count_tokens``: ``{"input_tokens": N}``.

**The answer** is scripted by the request's :class:`~iop_edge.testing.fake_behavior.FakeBehavior`
(its default, a queued one, the ``x-fake-behavior`` header or a ``[[fake:...]]`` directive in
the last user message, as for chat). Its blocks, in order:

- ``thinking`` (when :attr:`FakeBehavior.thinking` is set): ``thinking_delta`` one per word,
  then one ``signature_delta`` (:func:`fake_signature` of the text);
- ``text``: the reply (the last user message's text unless :attr:`FakeBehavior.reply` fixes it),
  cut at the first of ``stop_sequences`` (``stop_reason: stop_sequence``, ``stop_sequence``
  the one met), as ``text_delta`` one per word unless :attr:`FakeBehavior.chunks` says how
  many, at most ``max_tokens`` of them (``stop_reason: max_tokens``); left out when it is empty
  and another block is there;
- ``tool_use`` (when :attr:`FakeBehavior.tool_call` is set and the text was not cut by
  ``max_tokens``): id ``toolu_fake<n>``, its ``input`` streamed as ``input_json_delta`` pieces
  of at most 8 characters; ``stop_reason: tool_use``.

Otherwise ``stop_reason`` is ``end_turn``. Usage: ``input_tokens`` counts the words of the
system prompt and of every message's text, plus one per tool definition (what
``count_tokens`` answers too); ``output_tokens`` counts the deltas of every block (a signature
is not one).

**Errors** are in Anthropic's shape, ``{"type": "error", "error": {"type", "message"}}``, the
type named after the status (:attr:`FakeBehavior.error_code` overrides it): a malformed request
(no ``model``, ``max_tokens`` or ``messages``), a wrong key, an unknown model with
``strict_models``, a behaviour ``status``. ``fault`` works as for chat, counting events as
frames: ``error`` writes ``event: error`` with an ``api_error`` (or ``error_code``) carrying
``error_message``, then ends the body without ``message_stop``; a non-streamed request gets a
500 instead.

With ``api_key`` set, a request must carry it as ``x-api-key`` (what Anthropic's clients send)
or as ``Authorization: Bearer`` (what vLLM also accepts).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Final

import orjson
from aiohttp import web

from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_upstream import (
    FakeUpstream,
    RejectedRequest,
    count_words,
    last_user_text,
    message_text,
    split_reply,
)

__all__ = [
    "ANTHROPIC_ERROR_TYPES",
    "FakeMessagesUpstream",
    "fake_signature",
    "input_tokens",
]

#: Anthropic's error type for each status it answers (another 4xx: ``invalid_request_error``,
#: another 5xx: ``api_error``).
ANTHROPIC_ERROR_TYPES: Final[Mapping[int, str]] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}

_TOOL_PIECE: Final = 8
"""Characters of a tool's input JSON per ``input_json_delta``."""


def fake_signature(thinking: str) -> str:
    """The signature the fake gives a thinking block: base64 of the text's SHA-256 (the same
    text always gets the same one, as a client sending a block back expects)."""
    return base64.b64encode(hashlib.sha256(thinking.encode()).digest()).decode()


def input_tokens(body: Mapping[str, Any]) -> int:
    """The fake's count of a Messages request's input: the words of the system prompt and of
    every message's text, plus one per tool definition."""
    system = body.get("system")
    tools = body.get("tools")
    return (
        len(message_text(system).split())
        + count_words(body.get("messages"))
        + (len(tools) if isinstance(tools, list) else 0)
    )


def _event(name: str, payload: Mapping[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def _cut(text: str, stop_sequences: object) -> tuple[str, str | None]:
    """``text`` up to the earliest of ``stop_sequences``, and the sequence met (or None)."""
    met: str | None = None
    at = len(text)
    if isinstance(stop_sequences, list):
        for sequence in stop_sequences:
            if isinstance(sequence, str) and sequence:
                found = text.find(sequence)
                if 0 <= found < at:
                    met, at = sequence, found
    return text[:at], met


class _Answer:
    """One scripted answer: its blocks (type, start object, deltas) and how it stopped."""

    def __init__(self, body: Mapping[str, Any], behavior: FakeBehavior, prompt: str, n: int):
        text, met = _cut(
            prompt if behavior.reply is None else behavior.reply, body.get("stop_sequences")
        )
        pieces = split_reply(text, behavior.chunks)
        max_tokens = body.get("max_tokens")
        cut = isinstance(max_tokens, int) and 0 <= max_tokens < len(pieces)
        if cut:
            pieces = pieces[:max_tokens]
        self.stop_reason = "max_tokens" if cut else "stop_sequence" if met else "end_turn"
        self.stop_sequence = None if cut else met
        #: (block as it is whole, block as content_block_start opens it, deltas)
        self.blocks: list[tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]] = []
        if behavior.thinking is not None:
            thought = behavior.thinking
            deltas = [{"type": "thinking_delta", "thinking": p} for p in split_reply(thought, None)]
            signature = fake_signature(thought)
            self.blocks.append(
                (
                    {"type": "thinking", "thinking": thought, "signature": signature},
                    {"type": "thinking", "thinking": "", "signature": ""},
                    [*deltas, {"type": "signature_delta", "signature": signature}],
                )
            )
        tool = behavior.tool_call if not cut else None
        if pieces or not (self.blocks or tool):
            self.blocks.append(
                (
                    {"type": "text", "text": "".join(pieces)},
                    {"type": "text", "text": ""},
                    [{"type": "text_delta", "text": p} for p in pieces],
                )
            )
        if tool is not None:
            name, _, arguments = tool.partition(":")
            arguments = arguments or "{}"
            opened = {"type": "tool_use", "id": f"toolu_fake{n}", "name": name, "input": {}}
            json_pieces = [
                arguments[i : i + _TOOL_PIECE] for i in range(0, len(arguments), _TOOL_PIECE)
            ]
            self.blocks.append(
                (
                    {**opened, "input": orjson.loads(arguments)},
                    opened,
                    [{"type": "input_json_delta", "partial_json": p} for p in json_pieces],
                )
            )
            self.stop_reason = "tool_use"
        self.output_tokens = sum(
            1 for _, _, deltas in self.blocks for d in deltas if d["type"] != "signature_delta"
        )


class FakeMessagesUpstream(FakeUpstream):
    """A fake upstream that serves Anthropic Messages natively (see the module docstring):
    :meth:`_add_messages_routes` adds ``/v1/messages`` and ``/v1/messages/count_tokens``."""

    api_key: str | None = None
    """The key a request must carry (``x-api-key`` or ``Authorization: Bearer``); None: any."""

    _stream_error_type: ClassVar[str] = "api_error"

    def _add_messages_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1/messages", self._generation(self._messages))
        router.add_post("/v1/messages/count_tokens", self._generation(self._count_tokens))

    def _anthropic_error(
        self, status: int, message: str, kind: str | None = None, retry_after: str | None = None
    ) -> web.Response:
        """An error in Anthropic's shape, its type named after ``status`` unless ``kind``."""
        kind = (
            kind
            or ANTHROPIC_ERROR_TYPES.get(status)
            or ("api_error" if status >= 500 else "invalid_request_error")
        )
        body = {"type": "error", "error": {"type": kind, "message": message}}
        response = web.Response(
            status=status, body=orjson.dumps(body), content_type="application/json"
        )
        if retry_after is not None:
            response.headers["Retry-After"] = retry_after
        return response

    def _behavior_failure(self, behavior: FakeBehavior, status: int | None = None) -> web.Response:
        return self._anthropic_error(
            status or behavior.status,
            behavior.error_message,
            behavior.error_code,
            behavior.retry_after,
        )

    async def _messages_prelude(
        self, request: web.Request, *, generation: bool
    ) -> tuple[dict[str, Any], str, FakeBehavior, str]:
        """Authenticate, parse and check a Messages request; resolve its behaviour."""
        key = self.api_key
        if key is not None and key not in (
            request.headers.get("x-api-key"),
            (request.headers.get("Authorization") or "").removeprefix("Bearer "),
        ):
            self._record(request, None, FakeBehavior())
            raise RejectedRequest(401, "invalid x-api-key")
        body = await self._read_json(request)
        behavior, prompt = self._resolve(request, body, last_user_text(body.get("messages")))
        model = body.get("model")
        required = ("model", "messages", "max_tokens") if generation else ("model", "messages")
        for name in required:
            if name not in body:
                raise RejectedRequest(400, f"{name}: Field required")
        if not isinstance(model, str) or not model:
            raise RejectedRequest(400, "model: Input should be a valid string")
        if not isinstance(body["messages"], list) or not body["messages"]:
            raise RejectedRequest(400, "messages: at least one message is required")
        if self.strict_models and model not in self.models:
            raise RejectedRequest(404, f"model: {model}")
        return body, model, behavior, prompt

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        try:
            body, model, behavior, prompt = await self._messages_prelude(request, generation=True)
        except RejectedRequest as exc:
            return self._anthropic_error(exc.status, exc.message)
        if not await self._before_answer(request, behavior):
            return web.Response()
        if behavior.status != 200:
            return self._behavior_failure(behavior)
        n = self._next_id()
        answer = _Answer(body, behavior, prompt, n)
        usage_in = input_tokens(body)
        message: dict[str, Any] = {
            "id": f"msg_fake{n}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [whole for whole, _, _ in answer.blocks],
            "stop_reason": answer.stop_reason,
            "stop_sequence": answer.stop_sequence,
            "usage": {"input_tokens": usage_in, "output_tokens": answer.output_tokens},
        }
        if not body.get("stream"):
            if behavior.fault == "error":
                return self._behavior_failure(behavior, 500)
            return await self._body(
                request, behavior, orjson.dumps(message), content_type="application/json"
            )
        start = {
            **message,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": usage_in, "output_tokens": 1},
        }
        frames = [
            _event("message_start", {"type": "message_start", "message": start}),
            _event("ping", {"type": "ping"}),
        ]
        for index, (_, opened, deltas) in enumerate(answer.blocks):
            frames.append(
                _event(
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": opened},
                )
            )
            frames.extend(
                _event(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                )
                for delta in deltas
            )
            frames.append(
                _event("content_block_stop", {"type": "content_block_stop", "index": index})
            )
        frames.append(
            _event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": answer.stop_reason,
                        "stop_sequence": answer.stop_sequence,
                    },
                    "usage": {"output_tokens": answer.output_tokens},
                },
            )
        )
        frames.append(_event("message_stop", {"type": "message_stop"}))
        return await self._event_stream(request, behavior, frames)

    async def _event_stream(
        self, request: web.Request, behavior: FakeBehavior, frames: Sequence[bytes]
    ) -> web.StreamResponse:
        error = {
            "type": "error",
            "error": {
                "type": behavior.error_code or self._stream_error_type,
                "message": behavior.error_message,
            },
        }
        return await self._stream(
            request,
            behavior,
            frames,
            content_type="text/event-stream; charset=utf-8",
            malformed=b'event: content_block_delta\ndata: {"type":"content_block_delta",\n\n',
            error=_event("error", error),
        )

    async def _count_tokens(self, request: web.Request) -> web.StreamResponse:
        try:
            body, _, behavior, _ = await self._messages_prelude(request, generation=False)
        except RejectedRequest as exc:
            return self._anthropic_error(exc.status, exc.message)
        if not await self._before_answer(request, behavior):
            return web.Response()
        if behavior.status != 200:
            return self._behavior_failure(behavior)
        return web.Response(
            body=orjson.dumps({"input_tokens": input_tokens(body)}),
            content_type="application/json",
        )
