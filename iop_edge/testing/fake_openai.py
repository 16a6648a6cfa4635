"""A fake OpenAI-compatible upstream that speaks the real wire protocol, for tests and benchmarks.

Start it on ``127.0.0.1`` with a free port and point any OpenAI client at ``base_url``::

    async with FakeOpenAI() as fake:
        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="unused")
        reply = await client.chat.completions.create(model="fake-model", messages=[...])
        assert fake.requests[-1].json["model"] == "fake-model"

Endpoints: ``POST /v1/chat/completions`` (``chat.completion`` or SSE ``chat.completion.chunk``
events ending in ``data: [DONE]``, with the final usage chunk when
``stream_options.include_usage`` is true), ``POST /v1/completions`` (legacy ``text_completion``,
streaming and not), ``POST /v1/embeddings`` (an ``embedding`` per input, floats or, with
``encoding_format: "base64"``, the base64 of little-endian float32s; the vectors are
:func:`~iop_edge.testing.fake_upstream.fake_embedding` of each input, ``dimensions`` long when
asked; ``usage.prompt_tokens`` counts words, a token id as one) and ``GET /v1/models``.
Errors use the OpenAI envelope ``{"error": {"message", "type", "param", "code"}}``.

Like vLLM, llama.cpp and Ollama it also serves Anthropic Messages natively,
``POST /v1/messages`` and ``POST /v1/messages/count_tokens``, in Anthropic's shapes, errors
included (:mod:`~iop_edge.testing.fake_messages`); ``serves_messages=False`` makes a server
without them, which answers them 404. Like vLLM and llama.cpp it serves OpenAI Responses,
``POST /v1/responses``, Response objects and their event stream
(:mod:`~iop_edge.testing.fake_responses`); ``serves_responses=False`` makes a server without
it (404).

**The reply** echoes the last user message (the prompt, for ``/v1/completions``) unless
:attr:`FakeBehavior.reply` fixes it. It is cut at the first ``stop`` sequence (finish reason
``stop``) and split into content chunks, one per word unless :attr:`FakeBehavior.chunks` says
how many; at most ``max_tokens`` / ``max_completion_tokens`` chunks are sent (finish reason
``length``). Usage counts whitespace-separated words of every message as prompt tokens and
content chunks as completion tokens. A chat answer cut at a stop sequence names it in its
choice's ``stop_reason``, as vLLM does; :attr:`FakeBehavior.thinking` and
:attr:`FakeBehavior.tool_call` add ``reasoning_content`` (streamed word by word, before the
content) and a tool call (streamed as its head, then its arguments in two fragments).

With ``tokenizer="vllm"`` or ``"llama_cpp"`` it also serves that server's tokenizer endpoints
(``/tokenize``, ``/apply-template``) at its root: :mod:`iop_edge.testing.fake_tokenizer`.

Behaviour control and observation (:class:`~iop_edge.testing.fake_upstream.FakeBehavior`, the
``x-fake-behavior`` header, ``[[fake:...]]`` directives, counters and waits) live in
:mod:`iop_edge.testing.fake_upstream`; the names a test needs are re-exported here.

Run it standalone for benchmarks (prints the base URL, serves until SIGINT/SIGTERM)::

    python -m iop_edge.testing.fake_openai --port 8001 --behavior 'chunks=16&chunk_delay=0.001'
"""

from __future__ import annotations

import base64
import contextlib
import struct
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import orjson
from aiohttp import web

from iop_edge.testing.fake_behavior import (
    BEHAVIOR_HEADER,
    DEFAULT_BEHAVIOR,
    DIRECTIVE_PREFIX,
    FakeBehavior,
)
from iop_edge.testing.fake_messages import FakeMessagesUpstream
from iop_edge.testing.fake_responses import FakeResponsesUpstream
from iop_edge.testing.fake_tokenizer import FakeTokenizer, FakeTokenizerRoutes
from iop_edge.testing.fake_upstream import (
    FAKE_EMBEDDING_DIMENSIONS,
    FakeUpstreamStatistics,
    RecordedRequest,
    RejectedRequest,
    count_words,
    fake_embedding,
    last_user_text,
    serve_main,
    shape_reply,
    split_reply,
)

__all__ = [
    "BEHAVIOR_HEADER",
    "DIRECTIVE_PREFIX",
    "FakeBehavior",
    "FakeOpenAI",
    "FakeUpstreamStatistics",
    "RecordedRequest",
    "shape_reply",
    "split_reply",
]


class FakeOpenAI(FakeMessagesUpstream, FakeResponsesUpstream, FakeTokenizerRoutes):
    """A fake OpenAI-compatible server (``/v1/chat/completions``, ``/v1/completions``, models,
    Anthropic's ``/v1/messages`` unless ``serves_messages`` is false, and ``/v1/responses``
    unless ``serves_responses`` is false).

    ``api_key``, when set, must arrive as ``Authorization: Bearer <api_key>`` or the request
    gets 401 ``invalid_api_key``, like the real API (the Messages routes also take it as
    ``x-api-key``). ``tokenizer`` is the tokenizer dialect it serves at its root
    (:attr:`tokenizer`, reassignable; ``None``: none, both paths 404). See
    :class:`~iop_edge.testing.fake_upstream.FakeUpstream` for behaviour control and observation,
    and the module docstring for how replies are built.
    """

    _error_types: ClassVar[Mapping[int, str]] = {
        401: "invalid_request_error",
        403: "permission_error",
        404: "invalid_request_error",
        429: "rate_limit_error",
    }

    def __init__(
        self,
        *,
        behavior: FakeBehavior = DEFAULT_BEHAVIOR,
        models: Sequence[str] = ("fake-model",),
        strict_models: bool = False,
        api_key: str | None = None,
        serves_messages: bool = True,
        serves_responses: bool = True,
        record_limit: int = 1000,
        host: str = "127.0.0.1",
        port: int = 0,
        tokenizer: FakeTokenizer | None = None,
    ) -> None:
        self.api_key = api_key
        self.tokenizer = tokenizer
        self.serves_messages = serves_messages
        """Whether ``/v1/messages`` is served (fixed at construction: a chat-only server's
        routes do not change)."""
        self.serves_responses = serves_responses
        """Whether ``/v1/responses`` is served (fixed at construction)."""
        super().__init__(
            behavior=behavior,
            models=models,
            strict_models=strict_models,
            record_limit=record_limit,
            host=host,
            port=port,
        )
        self._expected_authorization = f"Bearer {api_key}" if api_key is not None else None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``: what an OpenAI client takes as ``base_url``."""
        return f"{self.origin}/v1"

    def _add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1/chat/completions", self._generation(self._chat))
        router.add_post("/v1/completions", self._generation(self._completions))
        router.add_post("/v1/embeddings", self._generation(self._embeddings))
        router.add_get("/v1/models", self._models)
        self._add_tokenizer_routes(router)
        if self.serves_messages:
            self._add_messages_routes(router)
        if self.serves_responses:
            self._add_responses_routes(router)

    def _error_response(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> web.Response:
        kind = self._error_types.get(status) or (
            "server_error" if status >= 500 else "invalid_request_error"
        )
        body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
        return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")

    def _check_auth(self, request: web.Request) -> None:
        expected = self._expected_authorization
        if expected is not None and request.headers.get("Authorization") != expected:
            raise RejectedRequest(401, "Incorrect API key provided.", code="invalid_api_key")

    async def _models(self, request: web.Request) -> web.StreamResponse:
        try:
            self._check_auth(request)
        except RejectedRequest as exc:
            self._record(request, None, DEFAULT_BEHAVIOR)
            return self._error_response(exc.status, exc.message, code=exc.code)
        data = [
            {"id": model, "object": "model", "created": 1700000000, "owned_by": "iop-edge-fake"}
            for model in self.models
        ]
        return await self._listing(request, orjson.dumps({"object": "list", "data": data}))

    async def _prelude(
        self, request: web.Request, prompt_of: Callable[[dict[str, Any]], str]
    ) -> tuple[dict[str, Any], str, FakeBehavior, str]:
        """Authenticate, parse, check the model and resolve the behaviour of a request."""
        try:
            self._check_auth(request)
        except RejectedRequest:
            self._record(request, None, DEFAULT_BEHAVIOR)
            raise
        body = await self._read_json(request)
        behavior, prompt = self._resolve(request, body, prompt_of(body))
        model = self._check_model(
            body.get("model"), not_found="The model `{model}` does not exist."
        )
        return body, model, behavior, prompt

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body, model, behavior, prompt = await self._prelude(
            request, lambda body: last_user_text(body.get("messages"))
        )
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RejectedRequest(
                400,
                "Missing required parameter: 'messages'.",
                param="messages",
                code="missing_required_parameter",
            )
        if not await self._before_answer(request, behavior):
            return web.Response()
        if behavior.status != 200:
            return self._failure(behavior)
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        pieces, finish = shape_reply(
            prompt if behavior.reply is None else behavior.reply,
            behavior.chunks,
            max_tokens=max_tokens,
            stop=body.get("stop"),
        )
        met = _matched_stop(
            prompt if behavior.reply is None else behavior.reply, body.get("stop"), finish
        )
        thought = split_reply(behavior.thinking, None) if behavior.thinking else []
        call = _tool_call(behavior.tool_call, self.total_requests) if finish == "stop" else None
        if call is not None:
            finish = "tool_calls"
        usage = _usage(count_words(messages), len(pieces) + len(thought) + (call is not None))
        completion_id = f"chatcmpl-fake{self._next_id()}"
        created = int(time.time())
        if not body.get("stream"):
            reply: dict[str, Any] = {
                "id": completion_id,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "system_fingerprint": "fp_fake",
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": "".join(pieces),
                            "refusal": None,
                        },
                        "logprobs": None,
                        "finish_reason": finish,
                    }
                ],
                "usage": usage,
            }
            choice = reply["choices"][0]
            if thought:
                choice["message"]["reasoning_content"] = behavior.thinking
            if call is not None:
                choice["message"]["tool_calls"] = [call]
            if met is not None:
                choice["stop_reason"] = met
            return await self._body(
                request, behavior, orjson.dumps(reply), content_type="application/json"
            )
        include_usage = _include_usage(body)
        head = (
            b'data: {"id":"' + completion_id.encode() + b'","object":"chat.completion.chunk",'
            b'"created":' + str(created).encode() + b',"model":' + orjson.dumps(model) + b","
            b'"system_fingerprint":"fp_fake","choices":[{"index":0,"delta":'
        )
        tail = b',"logprobs":null,"finish_reason":null}]' + _usage_null(include_usage) + b"}\n\n"
        frames = [head + b'{"role":"assistant","content":"","refusal":null}' + tail]
        frames.extend(
            head + b'{"reasoning_content":' + orjson.dumps(piece) + b"}" + tail for piece in thought
        )
        frames.extend(head + b'{"content":' + orjson.dumps(piece) + b"}" + tail for piece in pieces)
        if call is not None:
            arguments = call["function"]["arguments"]
            opened = {**call, "index": 0, "function": {**call["function"], "arguments": ""}}
            frames.append(head + orjson.dumps({"tool_calls": [opened]}) + tail)
            half = len(arguments) // 2  # (the arguments in two fragments, as servers stream)
            for fragment in (arguments[:half], arguments[half:]):
                delta = {"tool_calls": [{"index": 0, "function": {"arguments": fragment}}]}
                frames.append(head + orjson.dumps(delta) + tail)
        stop_reason = b"" if met is None else b',"stop_reason":' + orjson.dumps(met)
        frames.append(
            head
            + b'{},"logprobs":null,"finish_reason":"'
            + finish.encode()
            + b'"'
            + stop_reason
            + b"}]"
            + _usage_null(include_usage)
            + b"}\n\n"
        )
        if include_usage:
            frames.append(
                _usage_frame(completion_id, "chat.completion.chunk", created, model, usage)
            )
        frames.append(b"data: [DONE]\n\n")
        return await self._sse(request, behavior, frames, completion_id)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body, model, behavior, prompt = await self._prelude(
            request, lambda body: _prompt_text(body.get("prompt"))
        )
        if "prompt" not in body:
            raise RejectedRequest(
                400,
                "Missing required parameter: 'prompt'.",
                param="prompt",
                code="missing_required_parameter",
            )
        if not await self._before_answer(request, behavior):
            return web.Response()
        if behavior.status != 200:
            return self._failure(behavior)
        pieces, finish = shape_reply(
            prompt if behavior.reply is None else behavior.reply,
            behavior.chunks,
            max_tokens=body.get("max_tokens"),
            stop=body.get("stop"),
        )
        usage = _usage(len(prompt.split()), len(pieces))
        completion_id = f"cmpl-fake{self._next_id()}"
        created = int(time.time())
        if not body.get("stream"):
            reply = {
                "id": completion_id,
                "object": "text_completion",
                "created": created,
                "model": model,
                "system_fingerprint": "fp_fake",
                "choices": [
                    {"index": 0, "text": "".join(pieces), "logprobs": None, "finish_reason": finish}
                ],
                "usage": usage,
            }
            return await self._body(
                request, behavior, orjson.dumps(reply), content_type="application/json"
            )
        include_usage = _include_usage(body)
        head = (
            b'data: {"id":"' + completion_id.encode() + b'","object":"text_completion",'
            b'"created":' + str(created).encode() + b',"model":' + orjson.dumps(model) + b","
            b'"system_fingerprint":"fp_fake","choices":[{"index":0,"text":'
        )
        tail = b',"logprobs":null,"finish_reason":null}]' + _usage_null(include_usage) + b"}\n\n"
        frames = [head + orjson.dumps(piece) + tail for piece in pieces]
        frames.append(
            head
            + b'"","logprobs":null,"finish_reason":"'
            + finish.encode()
            + b'"}]'
            + _usage_null(include_usage)
            + b"}\n\n"
        )
        if include_usage:
            frames.append(_usage_frame(completion_id, "text_completion", created, model, usage))
        frames.append(b"data: [DONE]\n\n")
        return await self._sse(request, behavior, frames, completion_id)

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        body, model, behavior, _ = await self._prelude(
            request, lambda body: "".join(embedding_texts(body.get("input"))[-1:])
        )
        texts = embedding_texts(body.get("input"))
        if not texts:
            raise RejectedRequest(
                400,
                "'input' must be a non-empty string or array.",
                param="input",
                code="invalid_value",
            )
        dimensions = body.get("dimensions")
        if dimensions is not None and (type(dimensions) is not int or dimensions < 1):
            raise RejectedRequest(
                400, "'dimensions' must be a positive integer.", param="dimensions"
            )
        encoding = body.get("encoding_format", "float")
        if encoding not in ("float", "base64"):
            raise RejectedRequest(
                400, "'encoding_format' must be 'float' or 'base64'.", param="encoding_format"
            )
        if not await self._before_answer(request, behavior):
            return web.Response()
        if behavior.status != 200:
            return self._failure(behavior)
        data: list[dict[str, Any]] = []
        for index, text in enumerate(texts):
            vector = fake_embedding(text, dimensions or FAKE_EMBEDDING_DIMENSIONS)
            encoded: object = vector
            if encoding == "base64":
                encoded = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        prompt_tokens = sum(len(text.split()) for text in texts)
        reply = {
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        }
        return await self._body(
            request, behavior, orjson.dumps(reply), content_type="application/json"
        )

    async def _sse(
        self,
        request: web.Request,
        behavior: FakeBehavior,
        frames: Sequence[bytes],
        completion_id: str,
    ) -> web.StreamResponse:
        error = {
            "error": {
                "message": behavior.error_message,
                "type": "server_error",
                "param": None,
                "code": behavior.error_code,
            }
        }
        return await self._stream(
            request,
            behavior,
            frames,
            content_type="text/event-stream; charset=utf-8",
            malformed=b'data: {"id":"' + completion_id.encode() + b'","choices":[{"delta":\n\n',
            error=b"data: " + orjson.dumps(error) + b"\n\n",
        )


def embedding_texts(given: object) -> list[str]:
    """The texts of an embeddings ``input``: a string, strings, token ids (one text, the ids
    joined by spaces) or token-id lists (one text each); ``[]`` for anything else."""
    if isinstance(given, str):
        return [given] if given else []
    if not isinstance(given, list) or not given:
        return []
    if all(isinstance(item, str) for item in given):
        return list(given)
    if all(type(item) is int for item in given):
        return [" ".join(map(str, given))]
    if all(isinstance(item, list) for item in given):
        return [" ".join(map(str, item)) for item in given]
    return []


def _prompt_text(prompt: object) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        return prompt[0]
    return ""


def _include_usage(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _usage_null(include_usage: bool) -> bytes:
    return b',"usage":null' if include_usage else b""


def _usage_frame(
    completion_id: str, kind: str, created: int, model: str, usage: dict[str, int]
) -> bytes:
    chunk = {
        "id": completion_id,
        "object": kind,
        "created": created,
        "model": model,
        "system_fingerprint": "fp_fake",
        "choices": [],
        "usage": usage,
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def _matched_stop(text: str, stop: object, finish: str) -> str | None:
    """The stop sequence that cut ``text`` (reported as vLLM does, in the choice's
    ``stop_reason``), if any cut it and the answer was not cut by its length first."""
    if finish != "stop":
        return None
    stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else ()
    found = [(text.find(q), q) for q in stops if isinstance(q, str) and q and q in text]
    return min(found)[1] if found else None


def _tool_call(scripted: str | None, ordinal: int) -> dict[str, Any] | None:
    """The chat tool call of :attr:`FakeBehavior.tool_call` (``NAME`` or ``NAME:{json}``)."""
    if scripted is None:
        return None
    name, _, arguments = scripted.partition(":")
    return {
        "id": f"call_fake{ordinal}",
        "type": "function",
        "function": {"name": name, "arguments": arguments or "{}"},
    }


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``python -m iop_edge.testing.fake_openai``."""
    serve_main(FakeOpenAI, argv)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main(sys.argv[1:])
