"""A chat request's input tokens counted by the upstream's own tokenizer, for
``POST /v1/messages/count_tokens`` (an ``openai_compat`` provider's; see
:meth:`iop_edge.adapters.openai_compat.OpenAICompatExecutor.count_tokens`).

Two dialects, tried in this order, at the server's root (``base_url`` without a trailing
``/v1``: both servers serve these paths beside ``/v1``, not under it):

- **vLLM**: ``POST /tokenize`` with ``{"model": <target>, "messages", "tools" (when the request
  has any), "add_generation_prompt": true}`` — the chat template applied, as for a chat
  request — answering ``{"count": N, "max_model_len", "tokens": [...]}``: the count is ``N``.
- **llama.cpp**: ``POST /apply-template`` with ``{"model": <target>, "messages", "tools"}``
  answering ``{"prompt": "<the templated text>"}``, then ``POST /tokenize`` with ``{"model",
  "content": <that text>, "add_special": true, "parse_special": true}`` (as llama-server
  tokenizes a chat prompt: the BOS added, the template's special tokens parsed) answering
  ``{"tokens": [...]}``: the count is their number.

Each request carries what a chat request to the provider carries (the ``headers`` execution
field, the provider auth, ``x-request-id``) and is bounded like one, by the provider's deadline
machinery (:mod:`iop_edge.adapters.deadlines`, on the executor's clock), but at most
:data:`TOKENIZE_TIMEOUT_MS`: counting is one tokenizer pass, and an upstream that takes longer
is better answered by the edge's estimate than waited for.

**Detection is remembered per executor.** The dialect that answered is used alone from then
on. A dialect whose endpoint is not there — 404 or 405, or a 200 in another shape (llama.cpp
answers vLLM's body with ``{"tokens": []}``) — is remembered as not spoken, so once neither is,
every later call returns ``None`` at once, with no request. What may pass is never remembered:
a connection failure, a timeout, a 5xx (the call stops there and returns ``None``; the next one
tries again), nor another 4xx such as a 400 (the next dialect is tried): a 400 more often means
that this request cannot be templated — an image for a text-only model — than that the
endpoint is missing, and one such request must not switch counting off for good. A remembered
dialect whose endpoint later answers 404/405 is forgotten (the upstream was replaced), and the
next call detects again.

**Never raises** (but for a cancellation): every failure returns ``None`` — the edge then
answers with its estimate — and is logged at debug level with the provider and the reason
(URLs with their credentials removed; never a header, so never a token).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final, Literal

import orjson

from iop_edge.adapters.base import UpstreamReply
from iop_edge.adapters.openai_format import dumps
from iop_edge.adapters.upstream_http import HttpBackend, HttpTarget, post_for_body
from iop_edge.errors import AdapterError
from iop_edge.runtime.logs import get_logger

__all__ = ["TOKENIZE_TIMEOUT_MS", "TokenizerDialect", "UpstreamTokenizer", "server_root"]

TOKENIZE_TIMEOUT_MS: Final = 10_000
"""The most one tokenizer request may take (the provider's ``request_timeout_ms`` when
shorter)."""

TokenizerDialect = Literal["vllm", "llama_cpp"]
"""Which tokenize API an upstream speaks."""

_DIALECTS: Final[tuple[TokenizerDialect, ...]] = ("vllm", "llama_cpp")
_ABSENT_STATUSES: Final = frozenset({404, 405})


class _Miss(Exception):
    """One dialect did not give a count: ``absent`` when its endpoint is not there (to be
    remembered), ``stop`` when the upstream failed (no other dialect is tried)."""

    def __init__(self, reason: str, *, absent: bool = False, stop: bool = False) -> None:
        super().__init__(reason)
        self.absent = absent
        self.stop = stop


def server_root(base_url: str | None) -> str | None:
    """``base_url`` without its trailing ``/v1`` (and slash): where ``/tokenize`` is."""
    if base_url is None:
        return None
    root = base_url.rstrip("/")
    return root.removesuffix("/v1")


class UpstreamTokenizer:
    """Counts chat requests' input tokens on one upstream (see the module docstring)."""

    def __init__(self, backend: HttpBackend, target: HttpTarget) -> None:
        self._backend = backend
        # Its own deadlines, on the provider's clock, at most TOKENIZE_TIMEOUT_MS each.
        self._target = dataclasses.replace(
            target, timeout_ms=min(target.timeout_ms, TOKENIZE_TIMEOUT_MS)
        )
        self._root = server_root(target.base_url)
        self._spoken: TokenizerDialect | None = None
        self._unspoken: set[TokenizerDialect] = set()

    async def count(
        self,
        chat_body: Mapping[str, Any],
        target: str,
        headers: Mapping[str, str],
        request_id: str,
    ) -> int | None:
        """The input tokens of ``chat_body`` (its ``messages`` and ``tools``) for the model
        ``target``, or ``None`` when the upstream cannot count them."""
        if self._root is None:
            self._debug("the provider has no base_url")
            return None
        messages = chat_body.get("messages")
        if not isinstance(messages, list):
            self._debug("the request has no messages list")
            return None
        tools = chat_body.get("tools") or None
        if self._spoken is not None:
            order: tuple[TokenizerDialect, ...] = (self._spoken,)
        else:
            order = tuple(d for d in _DIALECTS if d not in self._unspoken)
            if not order:
                self._debug("it serves neither vLLM's nor llama.cpp's /tokenize (remembered)")
                return None
        reasons: list[str] = []
        for dialect in order:
            try:
                if dialect == "vllm":
                    found = await self._vllm(messages, tools, target, headers, request_id)
                else:
                    found = await self._llama_cpp(messages, tools, target, headers, request_id)
            except _Miss as miss:
                reasons.append(f"{dialect}: {miss}")
                if miss.absent:
                    self._unspoken.add(dialect)
                    if self._spoken == dialect:
                        self._spoken = None
                if miss.stop:
                    break
                continue
            self._spoken = dialect
            self._unspoken.discard(dialect)
            return found
        self._debug("; ".join(reasons))
        return None

    async def _vllm(
        self,
        messages: list[Any],
        tools: object,
        target: str,
        headers: Mapping[str, str],
        request_id: str,
    ) -> int:
        body = {**_chat(messages, tools, target), "add_generation_prompt": True}
        answer = await self._post("tokenize", body, headers, request_id)
        count = answer.get("count")
        if type(count) is not int or count < 0:
            raise _Miss("POST /tokenize answered 200 without vLLM's count", absent=True)
        return count

    async def _llama_cpp(
        self,
        messages: list[Any],
        tools: object,
        target: str,
        headers: Mapping[str, str],
        request_id: str,
    ) -> int:
        templated = await self._post(
            "apply-template", _chat(messages, tools, target), headers, request_id
        )
        prompt = templated.get("prompt")
        if not isinstance(prompt, str):
            raise _Miss("POST /apply-template answered 200 without a prompt", absent=True)
        content = {"model": target, "content": prompt, "add_special": True, "parse_special": True}
        answer = await self._post("tokenize", content, headers, request_id)
        tokens = answer.get("tokens")
        if not isinstance(tokens, list):
            raise _Miss("POST /tokenize answered 200 without llama.cpp's tokens", absent=True)
        return len(tokens)

    async def _post(
        self, path: str, body: dict[str, Any], headers: Mapping[str, str], request_id: str
    ) -> dict[str, Any]:
        """POST ``body`` to ``{root}/{path}``; the JSON object of a 200, else :class:`_Miss`."""
        url = f"{self._root}/{path}"
        try:
            got = await post_for_body(
                self._backend, self._target, url, dumps(body), headers, request_id
            )
        except AdapterError as exc:  # connection, timeout, a status the edge never relays
            raise _Miss(str(exc), stop=True) from exc
        if isinstance(got, UpstreamReply):
            raise _refused(path, got)
        try:
            answer = orjson.loads(got)
        except orjson.JSONDecodeError as exc:
            raise _Miss(f"POST /{path} answered 200 with a body that is not JSON") from exc
        if not isinstance(answer, dict):
            raise _Miss(f"POST /{path} answered 200 with JSON that is not an object")
        return answer

    def _debug(self, reason: str) -> None:
        # Got here, not at import: a logger cached at import keeps the first configuration's
        # stream and level (structlog caches on first use), whatever is configured later.
        get_logger("adapters").debug(
            "upstream_token_count_unavailable", provider=self._target.label, reason=reason
        )


def _refused(path: str, reply: UpstreamReply) -> _Miss:
    """The miss of an error status: 404/405 the endpoint is absent; a 5xx stops the call."""
    said = f"POST /{path}: {reply.detail or f'the upstream answered {reply.status}'}"
    if reply.status in _ABSENT_STATUSES:
        return _Miss(said, absent=True)
    return _Miss(said, stop=reply.status >= 500)


def _chat(messages: list[Any], tools: object, target: str) -> dict[str, Any]:
    """The chat part both dialects template: the target model, the messages, the tools."""
    body: dict[str, Any] = {"model": target, "messages": messages}
    if tools is not None:
        body["tools"] = tools
    return body
