"""A fake Ollama server that speaks Ollama's HTTP API, for tests and benchmarks.

::

    async with FakeOllama() as fake:
        async with session.post(f"{fake.base_url}/api/chat", json={...}) as response:
            ...  # NDJSON lines; the last has "done": true
        assert fake.requests[-1].json["options"]["num_predict"] == 64

Endpoints, as Ollama serves them:

- ``POST /api/chat``: ``stream`` defaults to true. A stream is ``application/x-ndjson``, one
  line per content chunk ``{"model", "created_at", "message": {"role": "assistant",
  "content"}, "done": false}`` and a final line with empty content, ``"done": true``,
  ``done_reason`` (``stop`` or ``length``), ``total_duration``, ``load_duration``,
  ``prompt_eval_count``, ``prompt_eval_duration``, ``eval_count``, ``eval_duration``
  (durations in nanoseconds). Without streaming the same final object carries the whole
  message. ``options`` are honoured as far as a fake can: ``num_predict`` caps the chunks
  (``done_reason: length``) and ``stop`` cuts the text; ``temperature``, ``top_p`` and
  ``num_ctx`` are only recorded (every request body is in :attr:`FakeUpstream.requests`).
- Tools, as a model that always uses them: a chat request with ``tools`` whose last message is
  not a ``tool`` result answers with one call of the first tool, ``arguments`` an object that
  gives its first required parameter (else its first one, else ``input``) the last user
  message's text, empty ``content`` and ``done_reason: stop``; streamed, the call comes in one
  ``done: false`` line before the final one. After a ``tool`` message the answer is ``the tool
  said: <its content>``.
- Thinking, as a thinking model: a chat request whose ``think`` is ``true`` or a level
  (``"low"``, ``"medium"``, ``"high"``) answers with ``message.thinking`` =
  :func:`fake_thinking` of the prompt (streamed, in one ``done: false`` line before the
  content); ``think`` ``false`` or absent: no thinking. ``think`` and the history's
  ``thinking`` are recorded with the rest of the body.
- ``POST /api/embed``: ``input`` a string or an array of strings (anything else is a 400);
  ``{"model", "embeddings": [[...], ...], "total_duration", "load_duration",
  "prompt_eval_count"}``, each vector :func:`~iop_edge.testing.fake_upstream.fake_embedding`
  of its input, ``dimensions`` long when asked; ``prompt_eval_count`` counts words.
- ``GET /api/tags`` (the models), ``GET /api/version``, and ``GET /`` ("Ollama is running").

Errors are Ollama's ``{"error": "message"}`` with the status; an in-stream error (the ``error``
fault) is a line ``{"error": "message"}``. The reply, the chunking, the prompt and completion
counts and every behaviour control are those of :mod:`iop_edge.testing.fake_upstream`
(:class:`~iop_edge.testing.fake_upstream.FakeBehavior`, the ``x-fake-behavior`` header, the
``[[fake:...]]`` directive); a model ``m`` matches a listed ``m:latest`` as in Ollama.

Standalone: ``python -m iop_edge.testing.fake_ollama --port 11434``.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Sequence
from typing import Any

import orjson
from aiohttp import web

from iop_edge.testing.fake_behavior import DEFAULT_BEHAVIOR, FakeBehavior
from iop_edge.testing.fake_upstream import (
    FAKE_EMBEDDING_DIMENSIONS,
    FakeUpstream,
    RejectedRequest,
    count_words,
    fake_embedding,
    last_user_text,
    serve_main,
    shape_reply,
)

__all__ = ["FakeOllama", "fake_thinking"]

_VERSION = b'{"version":"0.6.8"}'


class FakeOllama(FakeUpstream):
    """A fake Ollama server (``/api/chat``, ``/api/tags``); :attr:`base_url` has no path.

    See :class:`~iop_edge.testing.fake_upstream.FakeUpstream` for behaviour control and
    observation; the defaults list one model, ``fake-model:latest``.
    """

    def __init__(
        self,
        *,
        behavior: FakeBehavior = DEFAULT_BEHAVIOR,
        models: Sequence[str] = ("fake-model:latest",),
        strict_models: bool = False,
        record_limit: int = 1000,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(
            behavior=behavior,
            models=models,
            strict_models=strict_models,
            record_limit=record_limit,
            host=host,
            port=port,
        )

    def _add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/api/chat", self._generation(self._chat))
        router.add_post("/api/embed", self._generation(self._embed))
        router.add_get("/api/tags", self._tags)
        router.add_get("/api/version", self._version)
        router.add_get("/", self._root)

    def _error_response(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> web.Response:
        return web.Response(
            status=status,
            body=orjson.dumps({"error": message}),
            content_type="application/json",
        )

    async def _root(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text="Ollama is running")

    async def _version(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=_VERSION, content_type="application/json")

    async def _tags(self, request: web.Request) -> web.StreamResponse:
        models = [
            {
                "name": name,
                "model": name,
                "modified_at": "2025-01-01T00:00:00Z",
                "size": 4_661_224_676,
                "digest": f"{index:064x}",
                "details": {
                    "parent_model": "",
                    "format": "gguf",
                    "family": "llama",
                    "families": ["llama"],
                    "parameter_size": "8.0B",
                    "quantization_level": "Q4_K_M",
                },
            }
            for index, name in enumerate(self.models, start=1)
        ]
        return await self._listing(request, orjson.dumps({"models": models}))

    def _known(self, model: str) -> bool:
        return model in self.models or f"{model}:latest" in self.models

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter_ns()
        body = await self._read_json(request)
        messages = body.get("messages")
        behavior, prompt = self._resolve(request, body, last_user_text(messages))
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise RejectedRequest(400, "model is required")
        if self.strict_models and not self._known(model):
            raise RejectedRequest(404, f'model "{model}" not found, try pulling it first')
        if messages is not None and not isinstance(messages, list):
            raise RejectedRequest(400, "messages must be an array")
        options = body.get("options")
        if not isinstance(options, dict):
            options = {}
        if not await self._before_answer(request, behavior):
            return web.Response()
        if behavior.status != 200:
            return self._failure(behavior)
        tool_call = _tool_call(body.get("tools"), messages, prompt)
        last = messages[-1] if isinstance(messages, list) and messages else None
        if isinstance(last, dict) and last.get("role") == "tool":
            prompt = f"the tool said: {last.get('content')}"
        pieces, finish = shape_reply(
            "" if tool_call else prompt if behavior.reply is None else behavior.reply,
            behavior.chunks,
            max_tokens=options.get("num_predict"),
            stop=options.get("stop"),
        )
        thinking = fake_thinking(prompt) if body.get("think") not in (None, False) else None
        created_at = time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime())
        prompt_tokens = count_words(messages)
        elapsed = time.perf_counter_ns() - started
        final: dict[str, Any] = {
            "model": model,
            "created_at": created_at,
            "message": {"role": "assistant", "content": ""},
            "done_reason": finish,
            "done": True,
            "total_duration": elapsed,
            "load_duration": 0,
            "prompt_eval_count": prompt_tokens,
            "prompt_eval_duration": elapsed // 2,
            "eval_count": len(pieces),
            "eval_duration": elapsed - elapsed // 2,
        }
        if body.get("stream", True) is False:
            final["message"]["content"] = "".join(pieces)
            if thinking is not None:
                final["message"]["thinking"] = thinking
            if tool_call:
                final["message"]["tool_calls"] = [tool_call]
            return await self._body(
                request,
                behavior,
                orjson.dumps(final),
                content_type="application/json",
            )
        head = (
            b'{"model":'
            + orjson.dumps(model)
            + b',"created_at":"'
            + created_at.encode()
            + b'","message":{"role":"assistant","content":'
        )
        frames = [head + orjson.dumps(piece) + b'},"done":false}\n' for piece in pieces]
        if thinking is not None:
            frames.insert(
                0, head + b'"","thinking":' + orjson.dumps(thinking) + b'},"done":false}\n'
            )
        if tool_call:
            frames.append(
                head + b'"","tool_calls":' + orjson.dumps([tool_call]) + b'},"done":false}\n'
            )
        frames.append(orjson.dumps(final) + b"\n")
        return await self._stream(
            request,
            behavior,
            frames,
            content_type="application/x-ndjson",
            malformed=head + b'"unterminated\n',
            error=orjson.dumps({"error": behavior.error_message}) + b"\n",
        )

    async def _embed(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter_ns()
        body = await self._read_json(request)
        given = body.get("input")
        texts = [given] if isinstance(given, str) else given
        behavior, _ = self._resolve(
            request, body, texts[-1] if isinstance(texts, list) and texts else ""
        )
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise RejectedRequest(400, "model is required")
        if self.strict_models and not self._known(model):
            raise RejectedRequest(404, f'model "{model}" not found, try pulling it first')
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise RejectedRequest(400, "invalid input type")
        dimensions = body.get("dimensions") or FAKE_EMBEDDING_DIMENSIONS
        if not await self._before_answer(request, behavior):
            return web.Response()
        if behavior.status != 200:
            return self._failure(behavior)
        elapsed = time.perf_counter_ns() - started
        answer = {
            "model": model,
            "embeddings": [fake_embedding(text, dimensions) for text in texts],
            "total_duration": elapsed,
            "load_duration": 0,
            "prompt_eval_count": sum(len(text.split()) for text in texts),
        }
        return await self._body(
            request, behavior, orjson.dumps(answer), content_type="application/json"
        )


def fake_thinking(prompt: str) -> str:
    """What the fake thinks before answering ``prompt`` (when asked to think)."""
    return f"Thinking about: {prompt}"


def _tool_call(tools: object, messages: object, prompt: str) -> dict[str, Any] | None:
    """The call the fake model makes: of the first tool, unless the last message is a tool's
    result (see the module docstring)."""
    if not isinstance(tools, list) or not tools or not isinstance(tools[0], dict):
        return None
    last = messages[-1] if isinstance(messages, list) and messages else None
    if isinstance(last, dict) and last.get("role") == "tool":
        return None
    function = tools[0].get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        return None
    parameters = function.get("parameters")
    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    required = parameters.get("required") if isinstance(parameters, dict) else None
    names = [*(required or []), *(properties or {})] if isinstance(parameters, dict) else []
    argument = names[0] if names and isinstance(names[0], str) else "input"
    return {"function": {"index": 0, "name": function["name"], "arguments": {argument: prompt}}}


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``python -m iop_edge.testing.fake_ollama``."""
    serve_main(FakeOllama, argv)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main(sys.argv[1:])
