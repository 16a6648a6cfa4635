"""OpenAI chat answers decoded into the internal form (:mod:`iop_edge.translate.events`).

What the adapters produce (``openai_compat`` relays the upstream's frames; ``ollama`` and
``cli`` build the same, :mod:`iop_edge.adapters.openai_format`), and how it is read:

- **text**: ``delta.content`` (``message.content``); empty strings (the role chunk's ``""``)
  are no text.
- **reasoning**: ``reasoning_content`` (vLLM before 0.10, llama.cpp, DeepSeek, our Ollama
  translation), else ``reasoning`` (newer vLLM, OpenRouter).
- **tool calls**: ``delta.tool_calls[]`` items grouped by ``index``; the first item of a call
  carries ``id`` and ``function.name``, later ones ``function.arguments`` fragments (Ollama's
  translation sends a call whole). An item without ``index`` continues the open call, or
  starts a new one when it brings a new ``id``. Fragments that arrive before the name are held
  until it comes. A call's fragments must not resume once another call (or text) followed it:
  no server interleaves them, and both surfaces need one block at a time, so that is a
  failure, not a reordering.
- **finish**: ``finish_reason`` of choice 0; ``function_call`` reads as ``tool_calls``,
  TGI's ``eos_token`` / ``stop_sequence`` as ``stop``, ``abort`` / ``error`` as a failure, any
  other value as ``stop``. A ``stop`` with tool calls is ``tool_calls`` and a ``tool_calls``
  without any is ``stop`` (what the answer holds decides). vLLM's ``stop_reason``, when a
  string, is the stop sequence that ended it.
- **usage**: the last ``usage`` object seen, in any chunk (the finish chunk or the usage-only
  chunk after it), with ``prompt_tokens_details.cached_tokens`` and
  ``completion_tokens_details.reasoning_tokens`` when given.
- the end: ``data: [DONE]`` or :meth:`ChatStreamDecoder.end` (the adapter's frames ended)
  emits :class:`Finish`; an end without a ``finish_reason``, a chunk with ``error``, a chunk
  that is not a JSON object, or tool arguments that are not one JSON object are a
  :class:`Failure` (``upstream_error``), never a clean end.

Choices other than index 0 are ignored (a translated request never asks for ``n > 1``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

from iop_edge.errors import AdapterError
from iop_edge.translate.events import (
    Answer,
    AnswerEvent,
    Failure,
    Finish,
    FinishReason,
    ReasoningDelta,
    Start,
    TextDelta,
    TokenUsage,
    ToolCall,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
)
from iop_edge.translate.sse import SseReader

__all__ = ["ChatStreamDecoder", "decode_completion", "read_usage"]

_REASONS: Final[dict[str, FinishReason]] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "content_filter": "content_filter",
    "eos_token": "stop",
    "stop_sequence": "stop",
}
_FAILED_REASONS: Final = frozenset({"abort", "error"})


def _count(value: object) -> int | None:
    return value if type(value) is int and value >= 0 else None


def read_usage(source: object) -> TokenUsage | None:
    """The token counts of a chat ``usage`` object; ``None`` when it holds none."""
    if not isinstance(source, Mapping):
        return None
    prompt = _count(source.get("prompt_tokens"))
    completion = _count(source.get("completion_tokens"))
    if prompt is None and completion is None:
        return None
    prompt_details = source.get("prompt_tokens_details")
    completion_details = source.get("completion_tokens_details")
    return TokenUsage(
        prompt,
        completion,
        _count(prompt_details.get("cached_tokens"))
        if isinstance(prompt_details, Mapping)
        else None,
        _count(completion_details.get("reasoning_tokens"))
        if isinstance(completion_details, Mapping)
        else None,
    )


def _reasoning(delta: Mapping[str, Any]) -> object:
    text = delta.get("reasoning_content")
    return text if text is not None else delta.get("reasoning")


def _finish_reason(raw: str, has_calls: bool) -> FinishReason:
    reason = _REASONS.get(raw, "stop")
    if reason == "stop" and has_calls:
        return "tool_calls"
    if reason == "tool_calls" and not has_calls:
        return "stop"
    return reason


def whole_arguments(text: str, index: int, name: str) -> str:
    """A call's complete arguments, checked to be one JSON object (``{}`` for none); raises
    ValueError naming the call when they are not."""
    if not text.strip():
        return "{}"
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise ValueError(
            f"tool call {index} ({name!r}) has arguments that are not a JSON object: {text:.120}"
        )
    return text


class _OpenCall:
    __slots__ = ("call_id", "held", "index", "name", "parts", "started")

    def __init__(self, index: int, call_id: str) -> None:
        self.index = index
        self.call_id = call_id
        self.name = ""
        self.started = False
        self.parts: list[str] = []
        self.held: list[str] = []  # fragments that came before the name


class ChatStreamDecoder:
    """Decodes one answer's ``chat.completion.chunk`` stream into events (module docstring).

    Feed it parsed chunks (:meth:`feed`) or the adapter's frame bytes (:meth:`feed_frames`);
    call :meth:`end` when the frames end. After a :class:`Finish` or :class:`Failure`
    everything fed is ignored.
    """

    __slots__ = ("_call", "_done", "_ended", "_reader", "_reason", "_started", "_stop", "_usage")

    def __init__(self) -> None:
        self._reader = SseReader()
        self._started = False
        self._done = False
        self._call: _OpenCall | None = None
        self._ended = 0  # tool calls completed (each call's index is below it)
        self._reason: str | None = None
        self._stop: str | None = None
        self._usage: TokenUsage | None = None

    @property
    def done(self) -> bool:
        """Whether the answer has finished or failed."""
        return self._done

    def feed_frames(self, data: bytes) -> list[AnswerEvent]:
        """The events of SSE frame bytes (``data: {chunk}`` ... ``data: [DONE]``).

        The adapters write whole frames, each exactly ``data: <one line>`` and a blank line:
        such a batch (nothing held from before) is split at its frame boundaries at once; any
        other bytes go through the general reader (:class:`~iop_edge.translate.sse.SseReader`).
        The first way reads a batch of frames about three times faster, the most of what a
        translated stream costs apart from its JSON."""
        if (
            not self._reader.pending
            and data.startswith(b"data: ")
            and data.endswith(b"\n\n")
            and b"\r" not in data
            and data.count(b"\n") == 2 * data.count(b"\n\ndata: ") + 2
        ):
            payloads = data[6:-2].split(b"\n\ndata: ")
        else:
            payloads = [message.data for message in self._reader.feed(data)]
        events: list[AnswerEvent] = []
        for payload in payloads:
            if self._done:
                break
            if payload == b"[DONE]":
                events += self.end()
                continue
            try:
                chunk = orjson.loads(payload)
            except orjson.JSONDecodeError:
                chunk = None
            if type(chunk) is not dict:
                events += self._fail(f"a stream event is not a JSON object: {payload!r:.120}")
                continue
            events += self.feed(chunk)
        return events

    def feed(self, chunk: Mapping[str, Any]) -> list[AnswerEvent]:
        """The events of one parsed ``chat.completion.chunk``."""
        if self._done:
            return []
        events: list[AnswerEvent] = []
        if not self._started:
            self._started = True
            answer_id = chunk.get("id")
            events.append(Start(answer_id if isinstance(answer_id, str) else ""))
        if chunk.get("error") is not None:
            return events + self._fail(f"the upstream reported an error: {chunk['error']!s:.300}")
        raw_usage = chunk.get("usage")
        if raw_usage is not None:
            usage = read_usage(raw_usage)
            if usage is not None:
                self._usage = usage
        choices = chunk.get("choices")
        # type() before isinstance(): an ABC check (Mapping) costs several times a type test,
        # three times a chunk, and orjson's chunks hold nothing but dicts.
        for choice in choices if isinstance(choices, list) else ():
            if not (type(choice) is dict or isinstance(choice, Mapping)):
                continue
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if type(delta) is dict or isinstance(delta, Mapping):
                reasoning = _reasoning(delta)
                if isinstance(reasoning, str) and reasoning:
                    if not self._close(events):
                        return events
                    events.append(ReasoningDelta(reasoning))
                content = delta.get("content")
                if isinstance(content, str) and content:
                    if not self._close(events):
                        return events
                    events.append(TextDelta(content))
                calls = delta.get("tool_calls")
                for item in calls if isinstance(calls, list) else ():
                    if isinstance(item, Mapping) and not self._tool_delta(item, events):
                        return events
            reason = choice.get("finish_reason")
            if isinstance(reason, str):
                if reason in _FAILED_REASONS:
                    return events + self._fail(f"the upstream ended the answer with {reason!r}")
                self._reason = reason
                stop = choice.get("stop_reason")
                self._stop = stop if isinstance(stop, str) else None
        return events

    def end(self) -> list[AnswerEvent]:
        """The frames ended (or ``[DONE]`` came): close the open call and finish, or fail when
        no finish reason came."""
        if self._done:
            return []
        events: list[AnswerEvent] = []
        if not self._started:
            self._started = True
            events.append(Start(""))
        if not self._close(events):
            return events
        if self._reason is None:
            return events + self._fail("the stream ended without a finish_reason")
        self._done = True
        reason = _finish_reason(self._reason, self._ended > 0)
        events.append(Finish(reason, self._stop, self._usage))
        return events

    def _fail(self, why: str) -> list[AnswerEvent]:
        self._done = True
        return [Failure("upstream_error", f"The upstream's answer broke off: {why}.")]

    def _close(self, events: list[AnswerEvent]) -> bool:
        """Close the open tool call (its end, or a failure: False)."""
        call = self._call
        if call is None:
            return True
        self._call = None
        self._ended = call.index + 1
        if not call.started:
            events += self._fail(f"tool call {call.index} has no function name")
            return False
        try:
            arguments = whole_arguments("".join(call.parts), call.index, call.name)
        except ValueError as exc:
            events += self._fail(str(exc))
            return False
        events.append(ToolCallEnd(call.index, arguments))
        return True

    def _tool_delta(self, item: Mapping[str, Any], events: list[AnswerEvent]) -> bool:
        """One ``tool_calls`` item; False when it failed the answer."""
        call = self._call
        raw_id = item.get("id")
        call_id = raw_id if isinstance(raw_id, str) else ""
        index = item.get("index")
        if type(index) is not int:
            # No index (a server that leaves it out): a new id is a new call.
            if call is None:
                index = self._ended
            elif call_id and call.call_id and call_id != call.call_id:
                index = call.index + 1
            else:
                index = call.index
        if call is not None and call.index != index:
            if not self._close(events):
                return False
            call = None
        if call is None:
            if index < self._ended:
                events += self._fail(f"tool call {index} resumed after a later call or text began")
                return False
            call = self._call = _OpenCall(index, call_id)
        elif call_id and not call.call_id:
            call.call_id = call_id
        function = item.get("function")
        if not isinstance(function, Mapping):
            return True
        name = function.get("name")
        fragment = function.get("arguments")
        if isinstance(fragment, str) and fragment:
            call.parts.append(fragment)
            if call.started:
                events.append(ToolCallDelta(index, fragment))
            else:
                call.held.append(fragment)
        if not call.started and isinstance(name, str) and name:
            call.name = name
            call.started = True
            events.append(ToolCallStart(index, call.call_id, name))
            if call.held:
                events.append(ToolCallDelta(index, "".join(call.held)))
                call.held = []
        return True


def _broken(why: str) -> AdapterError:
    # The provider answered; what it answered is unusable. Not its health's concern (it may be
    # the model's output), so no failure kind.
    return AdapterError(
        "upstream_error", f"The upstream's answer cannot be translated: {why}.", failure=None
    )


def decode_completion(body: bytes | Mapping[str, Any]) -> Answer:
    """A non-streamed ``chat.completion`` (bytes or parsed) as an :class:`Answer`; raises
    :class:`~iop_edge.errors.AdapterError` (``upstream_error``) for one that breaks the rules
    of the module docstring."""
    if isinstance(body, bytes):
        try:
            body = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise _broken(f"it is not JSON ({exc})") from None
    if not isinstance(body, Mapping):
        raise _broken("it is not a JSON object")
    choices = body.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    message = choice.get("message") if isinstance(choice, Mapping) else None
    if not isinstance(message, Mapping):
        raise _broken("it has no choices[0].message")
    assert isinstance(choice, Mapping)
    content = message.get("content")
    text = content if isinstance(content, str) else ""
    if isinstance(content, list):  # (content parts, as some servers answer)
        text = "".join(
            p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str)
        )
    reasoning = _reasoning(message)
    calls: list[ToolCall] = []
    raw_calls = message.get("tool_calls")
    for index, call in enumerate(raw_calls if isinstance(raw_calls, list) else ()):
        function = call.get("function") if isinstance(call, Mapping) else None
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(name, str) or not name:
            raise _broken(f"tool call {index} has no function name")
        arguments = function.get("arguments")
        if isinstance(arguments, Mapping):  # (a server that sends the object itself)
            arguments = orjson.dumps(arguments).decode()
        try:
            arguments = whole_arguments(
                arguments if isinstance(arguments, str) else "", index, name
            )
        except ValueError as exc:
            raise _broken(str(exc)) from None
        call_id = call.get("id")
        calls.append(ToolCall(call_id if isinstance(call_id, str) else "", name, arguments))
    raw_reason = choice.get("finish_reason")
    if raw_reason in _FAILED_REASONS:
        raise _broken(f"the upstream ended the answer with {raw_reason!r}")
    stop = choice.get("stop_reason")
    answer_id = body.get("id")
    return Answer(
        answer_id if isinstance(answer_id, str) else "",
        text,
        reasoning if isinstance(reasoning, str) else "",
        tuple(calls),
        Finish(
            _finish_reason(raw_reason if isinstance(raw_reason, str) else "stop", bool(calls)),
            stop if isinstance(stop, str) else None,
            read_usage(body.get("usage")),
        ),
    )
