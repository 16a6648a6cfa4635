"""OpenAI Responses as an OpenAI-compatible server speaks it natively (vLLM and llama.cpp do):
the route :class:`~iop_edge.testing.fake_openai.FakeOpenAI` serves besides chat.

``POST /v1/responses`` answers a Response object (``{"id": "resp_fake<n>", "object":
"response", "created_at", "status", "error", "incomplete_details", "model", "output",
"usage", ...}`` and the request's ``instructions``, ``tools``, ``tool_choice``,
``parallel_tool_calls``, ``temperature``, ``top_p``, ``max_output_tokens``, ``metadata``,
``previous_response_id``, ``store``, ``reasoning``, ``text`` echoed), or with ``"stream": true``
its event stream, each event one frame ``event: <type>\\ndata: <json>\\n\\n`` carrying its
``type`` and its ``sequence_number`` (0, 1, 2...), in OpenAI's grammar:

- ``response.created``, ``response.in_progress``: the Response ``in_progress``, no output yet;
- per output item, ``response.output_item.added`` (the item ``in_progress``, empty), its
  content's events, ``response.output_item.done`` (the item whole);
- ``response.completed`` — or ``response.incomplete`` when ``max_output_tokens`` cut the text
  (``incomplete_details.reason: "max_output_tokens"``) — with the whole Response and usage.

**The output** is scripted by the request's :class:`~iop_edge.testing.fake_behavior.FakeBehavior`
(its default, a queued one, the ``x-fake-behavior`` header or a ``[[fake:...]]`` directive in
the last user message, as for chat). Its items, in order:

- ``reasoning`` (when :attr:`FakeBehavior.thinking` is set), ``rs_fake<n>``: the thinking one
  word per delta — as its ``summary`` (``response.reasoning_summary_part.added``,
  ``response.reasoning_summary_text.delta``... / ``.done``, ``response.reasoning_summary_part.
  done``) when the request asks for one (``reasoning.summary``), else as its ``content``
  (``response.content_part.added`` of a ``reasoning_text`` part,
  ``response.reasoning_text.delta``... / ``.done``, ``response.content_part.done``), as vLLM
  streams a reasoning model's thoughts;
- ``message``, ``msg_fake<n>``: one ``output_text`` part, the reply (the last user message's
  text unless :attr:`FakeBehavior.reply` fixes it), ``response.content_part.added``,
  ``response.output_text.delta`` one per word unless :attr:`FakeBehavior.chunks` says how many,
  at most ``max_output_tokens`` of them, ``response.output_text.done``,
  ``response.content_part.done``; left out when it is empty and another item is there;
- ``function_call`` (when :attr:`FakeBehavior.tool_call` is set and the text was not cut),
  ``fc_fake<n>`` with ``call_id`` ``call_fake<n>``: its arguments as
  ``response.function_call_arguments.delta`` pieces of at most 8 characters, then
  ``response.function_call_arguments.done``.

Usage: ``input_tokens`` counts the words of ``instructions``, of every input message's text
and of every ``function_call_output``'s output, plus one per tool definition;
``output_tokens`` counts the deltas of every item (``output_tokens_details.reasoning_tokens``
the reasoning's); ``input_tokens_details.cached_tokens`` is 0.

**Errors** are in the OpenAI envelope: a request without ``model`` or ``input``, a wrong key,
an unknown model with ``strict_models``, a behaviour ``status``. ``fault`` works as for chat,
counting events as frames: ``error`` writes ``response.failed`` (the Response ``failed``, its
``error`` ``{"code": error_code or "server_error", "message": error_message}``), then ends the
body; a non-streamed request gets a 500 instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import orjson
from aiohttp import web

from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_upstream import FakeUpstream, RejectedRequest, split_reply

__all__ = ["FakeResponsesUpstream", "input_text", "responses_input_tokens"]

_ARGUMENT_PIECE: Final = 8
"""Characters of a function call's arguments per ``response.function_call_arguments.delta``."""
#: Content part types whose ``text`` counts as a message's text.
_TEXT_PARTS: Final = frozenset({"input_text", "output_text", "text"})

_Prelude = tuple[dict[str, Any], str, FakeBehavior, str]


def _message_words(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            part["text"]
            for part in content
            if isinstance(part, dict)
            and part.get("type") in _TEXT_PARTS
            and isinstance(part.get("text"), str)
        )
    return ""


def input_text(given: object) -> str:
    """The text of the last user message of a Responses ``input`` (a string is one)."""
    if isinstance(given, str):
        return given
    if isinstance(given, list):
        for item in reversed(given):
            if isinstance(item, dict) and item.get("role") == "user":
                return _message_words(item.get("content"))
    return ""


def responses_input_tokens(body: Mapping[str, Any]) -> int:
    """The fake's count of a Responses request's input (see the module docstring)."""
    given = body.get("input")
    texts = [body.get("instructions")]
    if isinstance(given, str):
        texts.append(given)
    elif isinstance(given, list):
        for item in given:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "function_call_output":
                texts.append(item.get("output"))
            elif item.get("type", "message") == "message":
                texts.append(_message_words(item.get("content")))
    tools = body.get("tools")
    words = sum(len(text.split()) for text in texts if isinstance(text, str))
    return words + (len(tools) if isinstance(tools, list) else 0)


class _Output:
    """One scripted answer: its items (whole, with their deltas) and how it ended."""

    def __init__(self, body: Mapping[str, Any], behavior: FakeBehavior, prompt: str, n: int):
        pieces = split_reply(prompt if behavior.reply is None else behavior.reply, behavior.chunks)
        limit = body.get("max_output_tokens")
        self.cut = isinstance(limit, int) and 0 <= limit < len(pieces)
        if isinstance(limit, int) and self.cut:
            pieces = pieces[:limit]
        reasoning = body.get("reasoning")
        self.summary = isinstance(reasoning, dict) and bool(reasoning.get("summary"))
        #: (the item whole, its deltas)
        self.items: list[tuple[dict[str, Any], list[str]]] = []
        self.reasoning_tokens = 0
        if behavior.thinking is not None:
            thought = split_reply(behavior.thinking, None)
            self.reasoning_tokens = len(thought)
            item: dict[str, Any] = {"id": f"rs_fake{n}", "type": "reasoning", "summary": []}
            if self.summary:
                item["summary"] = [{"type": "summary_text", "text": behavior.thinking}]
            else:
                item["content"] = [{"type": "reasoning_text", "text": behavior.thinking}]
            self.items.append((item, thought))
        tool = behavior.tool_call if not self.cut else None
        if pieces or not (self.items or tool):
            text = "".join(pieces)
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            message = {
                "id": f"msg_fake{n}",
                "type": "message",
                "role": "assistant",
                "status": "incomplete" if self.cut else "completed",
                "content": [part],
            }
            self.items.append((message, pieces))
        if tool is not None:
            name, _, arguments = tool.partition(":")
            arguments = arguments or "{}"
            call = {
                "id": f"fc_fake{n}",
                "type": "function_call",
                "status": "completed",
                "call_id": f"call_fake{n}",
                "name": name,
                "arguments": arguments,
            }
            chunks = [
                arguments[i : i + _ARGUMENT_PIECE]
                for i in range(0, len(arguments), _ARGUMENT_PIECE)
            ]
            self.items.append((call, chunks))
        self.output_tokens = sum(len(deltas) for _, deltas in self.items)

    def events(self, add: Callable[..., None]) -> None:
        """Call ``add(type, **fields)`` for each event of the output items, in order."""
        for index, (item, deltas) in enumerate(self.items):
            at: dict[str, Any] = {"output_index": index}
            ids = {"item_id": item["id"], **at}
            kind = item["type"]
            opened = {**item, "status": "in_progress"}
            if kind == "reasoning":
                opened = {**item, "summary": []}
                if "content" in item:
                    opened["content"] = []
            elif kind == "message":
                opened["content"] = []
            elif kind == "function_call":
                opened["arguments"] = ""
            add("response.output_item.added", item=opened, **at)
            if kind == "reasoning" and self.summary:
                text = item["summary"][0]["text"]
                blank = {"type": "summary_text", "text": ""}
                where = {**ids, "summary_index": 0}
                add("response.reasoning_summary_part.added", part=blank, **where)
                for delta in deltas:
                    add("response.reasoning_summary_text.delta", delta=delta, **where)
                add("response.reasoning_summary_text.done", text=text, **where)
                add("response.reasoning_summary_part.done", part=item["summary"][0], **where)
            elif kind in ("reasoning", "message"):
                part = item["content"][0]
                where = {**ids, "content_index": 0}
                add("response.content_part.added", part={**part, "text": ""}, **where)
                if kind == "reasoning":
                    for delta in deltas:
                        add("response.reasoning_text.delta", delta=delta, **where)
                    add("response.reasoning_text.done", text=part["text"], **where)
                else:
                    for delta in deltas:
                        add("response.output_text.delta", delta=delta, logprobs=[], **where)
                    add("response.output_text.done", text=part["text"], logprobs=[], **where)
                add("response.content_part.done", part=part, **where)
            else:
                for delta in deltas:
                    add("response.function_call_arguments.delta", delta=delta, **ids)
                add("response.function_call_arguments.done", arguments=item["arguments"], **ids)
            add("response.output_item.done", item=item, **at)


def _frame(kind: str, payload: Mapping[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


class FakeResponsesUpstream(FakeUpstream):
    """A fake upstream that serves OpenAI Responses natively (see the module docstring):
    :meth:`_add_responses_routes` adds ``/v1/responses``. The server it is mixed into gives
    :meth:`_prelude` (authentication, the body, its model and behaviour) and the OpenAI error
    envelope (``_error_response``)."""

    async def _prelude(
        self, request: web.Request, prompt_of: Callable[[dict[str, Any]], str]
    ) -> _Prelude:
        """Authenticate, parse, check the model and resolve the behaviour of a request."""
        raise NotImplementedError

    def _add_responses_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1/responses", self._generation(self._responses))

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        body, model, behavior, prompt = await self._prelude(
            request, lambda body: input_text(body.get("input"))
        )
        given = body.get("input")
        if not isinstance(given, (str, list)) or not given:
            raise RejectedRequest(
                400,
                "Missing required parameter: 'input'.",
                param="input",
                code="missing_required_parameter",
            )
        if not await self._before_answer(request, behavior):
            return web.Response()
        if behavior.status != 200:
            return self._failure(behavior)
        n = self._next_id()
        output = _Output(body, behavior, prompt, n)
        prompt_tokens = responses_input_tokens(body)
        usage = {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output.output_tokens,
            "output_tokens_details": {"reasoning_tokens": output.reasoning_tokens},
            "total_tokens": prompt_tokens + output.output_tokens,
        }
        created = int(time.time())

        def response(status: str, **fields: Any) -> dict[str, Any]:
            return {
                "id": f"resp_fake{n}",
                "object": "response",
                "created_at": created,
                "status": status,
                "error": None,
                "incomplete_details": None,
                "instructions": body.get("instructions"),
                "max_output_tokens": body.get("max_output_tokens"),
                "model": model,
                "output": [],
                "parallel_tool_calls": body.get("parallel_tool_calls", True),
                "previous_response_id": body.get("previous_response_id"),
                "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
                "store": body.get("store", True),
                "temperature": body.get("temperature", 1.0),
                "text": body.get("text") or {"format": {"type": "text"}},
                "tool_choice": body.get("tool_choice", "auto"),
                "tools": body.get("tools") or [],
                "top_p": body.get("top_p", 1.0),
                "truncation": "disabled",
                "usage": None,
                "metadata": body.get("metadata") or {},
                **fields,
            }

        ending = "incomplete" if output.cut else "completed"
        final = response(
            ending,
            output=[item for item, _ in output.items],
            usage=usage,
            incomplete_details={"reason": "max_output_tokens"} if output.cut else None,
        )
        if not body.get("stream"):
            return await self._body(
                request, behavior, orjson.dumps(final), content_type="application/json"
            )
        frames: list[bytes] = []

        def add(kind: str, **fields: Any) -> None:
            frames.append(_frame(kind, {"type": kind, "sequence_number": len(frames), **fields}))

        add("response.created", response=response("in_progress"))
        add("response.in_progress", response=response("in_progress"))
        output.events(add)
        add(f"response.{ending}", response=final)
        failed_at = min(behavior.fault_after, len(frames))
        error = {"code": behavior.error_code or "server_error", "message": behavior.error_message}
        failed = {
            "type": "response.failed",
            "sequence_number": failed_at,
            "response": response("failed", error=error),
        }
        return await self._stream(
            request,
            behavior,
            frames,
            content_type="text/event-stream; charset=utf-8",
            malformed=(
                b"event: response.output_text.delta\n"
                b'data: {"type":"response.output_text.delta",\n\n'
            ),
            error=_frame("response.failed", failed),
        )
