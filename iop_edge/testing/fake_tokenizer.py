"""The tokenizer endpoints of the fake OpenAI-compatible upstream, in vLLM's or llama.cpp's
dialect (:attr:`FakeTokenizerRoutes.tokenizer`), at the server's root as both servers serve them.

- ``"vllm"``: ``POST /tokenize`` takes ``{"model", "messages", "tools"?,
  "add_generation_prompt"?}`` (the chat template applied; ``add_generation_prompt`` defaults
  to true) or ``{"model", "prompt"}`` (the text as it is) and answers ``{"count": N,
  "max_model_len": 8192, "tokens": [0, …, N-1], "token_strs": null}``; a body with neither is a
  400, as vLLM's validation answers it. ``POST /apply-template`` is a 404.
- ``"llama_cpp"``: ``POST /apply-template`` takes ``{"messages", "tools"?}`` and answers
  ``{"prompt": <the templated text>}``; ``POST /tokenize`` takes ``{"content", "add_special"?,
  "parse_special"?}`` and answers ``{"tokens": [0, …, N-1]}`` — and ``{"tokens": []}`` for a
  body without ``content``, as llama-server does (so vLLM's body gets a 200 in the wrong shape).
  ``add_special`` and ``parse_special`` are recorded and change nothing: the fake vocabulary
  has no BOS, and its special tokens are words like any other.
- ``None`` (the default): both paths answer 404, as a server without a tokenizer does.

**The fake's count** (the same in both dialects): its chat template writes one line per
message, ``<|role|> <text> <|end|>`` (the text: the message's string content or text parts),
after a line ``<|tools|> <the tools as compact JSON> <|end|>`` when there are tools, and ends
with the generation prompt ``<|assistant|>``; its tokenizer counts whitespace-separated words.
So a chat's count is the words of its messages' text + 2 per message + 1 (+ the words of the
tools' JSON + 2): :func:`fake_chat_tokens`. It differs from the edge's estimate
(``ceil(UTF-8 bytes / 4) + 3`` per message), so a test can tell which one answered: one user
message ``hello upstream world`` counts 6 here and 8 by the estimate.

Every request is recorded and counted like a generation request
(:attr:`~iop_edge.testing.fake_upstream.FakeUpstream.requests`, ``total_requests``...), and
honours the behaviour controls (``status``, ``hold``, ``latency``, faults) once its dialect
serves the path; a path the dialect does not serve answers 404 at once.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import orjson
from aiohttp import web

from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_upstream import FakeUpstream, RejectedRequest, message_text

__all__ = [
    "FAKE_MAX_MODEL_LEN",
    "FakeTokenizer",
    "FakeTokenizerRoutes",
    "fake_chat_prompt",
    "fake_chat_tokens",
    "fake_token_count",
]

FakeTokenizer = Literal["vllm", "llama_cpp"]
"""The tokenize dialect a fake upstream speaks."""

FAKE_MAX_MODEL_LEN: Final = 8192
"""The ``max_model_len`` of the fake's vLLM answers."""


def fake_chat_prompt(messages: object, tools: object, generation_prompt: bool = True) -> str:
    """The fake chat template's text for ``messages`` and ``tools`` (see the module docstring)."""
    lines: list[str] = []
    if isinstance(tools, list) and tools:
        lines.append(f"<|tools|> {orjson.dumps(tools).decode()} <|end|>")
    if isinstance(messages, list):
        for message in messages:
            if isinstance(message, dict):
                text = message_text(message.get("content"))
                lines.append(f"<|{message.get('role')}|> {text} <|end|>")
    if generation_prompt:
        lines.append("<|assistant|>")
    return "\n".join(lines)


def fake_token_count(text: str) -> int:
    """The fake tokenizer's count of ``text``: its whitespace-separated words."""
    return len(text.split())


def fake_chat_tokens(messages: object, tools: object = None) -> int:
    """What the fake counts for a chat request (with the generation prompt)."""
    return fake_token_count(fake_chat_prompt(messages, tools))


def _not_found() -> web.Response:
    return web.Response(status=404, text="404: Not Found")


class FakeTokenizerRoutes(FakeUpstream):
    """The tokenizer endpoints (see the module docstring), for a fake that sets
    :attr:`tokenizer` before its routes are added and calls :meth:`_add_tokenizer_routes`."""

    tokenizer: FakeTokenizer | None
    """The dialect served (``None``: none); reassign it to change what later requests get."""

    def _add_tokenizer_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/tokenize", self._generation(self._tokenize))
        router.add_post("/apply-template", self._generation(self._apply_template))

    async def _tokenizer_prelude(
        self, request: web.Request, serves: FakeTokenizer
    ) -> tuple[dict[str, Any], FakeBehavior] | web.StreamResponse:
        """Record the request; its body and behaviour, or the answer it gets at once (a 404
        when the dialect does not serve the path, a behaviour's status or disconnect)."""
        body = await self._read_json(request)
        behavior, _ = self._resolve(request, body, "")
        if self.tokenizer != serves:
            return _not_found()
        if not await self._before_answer(request, behavior):
            return web.Response()
        if behavior.status != 200:
            return self._failure(behavior)
        return body, behavior

    async def _tokenize(self, request: web.Request) -> web.StreamResponse:
        dialect = self.tokenizer or "vllm"  # (None: the prelude answers 404)
        got = await self._tokenizer_prelude(request, dialect)
        if isinstance(got, web.StreamResponse):
            return got
        body, behavior = got
        answer: dict[str, Any]
        if dialect == "vllm":
            messages, prompt = body.get("messages"), body.get("prompt")
            if isinstance(messages, list):
                generation_prompt = body.get("add_generation_prompt", True) is not False
                text = fake_chat_prompt(messages, body.get("tools"), generation_prompt)
            elif isinstance(prompt, str):
                text = prompt
            else:
                raise RejectedRequest(400, "Either 'messages' or 'prompt' is required.")
            count = fake_token_count(text)
            answer = {
                "count": count,
                "max_model_len": FAKE_MAX_MODEL_LEN,
                "tokens": list(range(count)),
                "token_strs": None,
            }
        else:
            content = body.get("content")
            count = fake_token_count(content) if isinstance(content, str) else 0
            answer = {"tokens": list(range(count))}
        return await self._body(
            request, behavior, orjson.dumps(answer), content_type="application/json"
        )

    async def _apply_template(self, request: web.Request) -> web.StreamResponse:
        got = await self._tokenizer_prelude(request, "llama_cpp")
        if isinstance(got, web.StreamResponse):
            return got
        body, behavior = got
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise RejectedRequest(400, "'messages' is required and must be an array.")
        answer = {"prompt": fake_chat_prompt(messages, body.get("tools"))}
        return await self._body(
            request, behavior, orjson.dumps(answer), content_type="application/json"
        )
