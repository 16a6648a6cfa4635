"""The internal form of an answer: surface-neutral events, decoded once from chat chunks.

Every adapter answers in OpenAI chat (a ``chat.completion`` or ``chat.completion.chunk``
frames); :mod:`iop_edge.translate.chat_events` decodes that once into the events below, and each
API surface (Anthropic Messages, later OpenAI Responses) renders them. No surface reads a chat
chunk itself, so the chat details (tool-call deltas by ``index``, ``reasoning_content`` or
``reasoning``, usage in a last chunk of its own, the finish reason's spellings) are handled in
one place.

A decoded stream is block-structured, which both surfaces need:

- it opens with one :class:`Start`, and ends with exactly one :class:`Finish` or
  :class:`Failure` (nothing follows either);
- text and reasoning come as :class:`TextDelta` / :class:`ReasoningDelta` (never empty);
- a tool call comes as one :class:`ToolCallStart`, its :class:`ToolCallDelta` fragments,
  and one :class:`ToolCallEnd` carrying the whole arguments (checked to be one JSON object),
  with no other event in between: at most one tool call is open at a time, and a text or
  reasoning delta, another call or the end closes it. ``index`` counts the answer's calls
  from 0, in start order.

A non-streamed answer decodes to an :class:`Answer`; :class:`AnswerBuilder` folds a decoded
stream into the same :class:`Answer`, so a surface's streamed and whole renderings can be
checked against each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "Answer",
    "AnswerBuilder",
    "AnswerEvent",
    "Failure",
    "Finish",
    "FinishReason",
    "ReasoningDelta",
    "Start",
    "TextDelta",
    "TokenUsage",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallEnd",
    "ToolCallStart",
]

#: Why an answer ended: ``stop`` (a natural end or a stop sequence), ``length`` (the token
#: limit), ``tool_calls`` (it ends by calling tools), ``content_filter`` (the upstream refused).
FinishReason = Literal["stop", "length", "tool_calls", "content_filter"]


@dataclass(frozen=True, slots=True)
class TokenUsage:
    """An answer's token counts as the upstream reported them (``None``: not reported).

    ``prompt_tokens`` includes ``cached_tokens`` (the part read from the upstream's prefix
    cache, ``prompt_tokens_details.cached_tokens``) and ``completion_tokens`` includes
    ``reasoning_tokens`` (``completion_tokens_details.reasoning_tokens``), as in OpenAI's usage.
    """

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Start:
    """The answer began; ``answer_id`` is the upstream's chat id (``""`` when it sent none)."""

    answer_id: str


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of the answer's text (never empty)."""

    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """A piece of the answer's reasoning (``reasoning_content``; never empty)."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """A tool call begins: its ``index`` in the answer, the upstream's id (``""`` when it sent
    none: each surface then makes its own from its answer's id and ``index``), the function."""

    index: int
    call_id: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A fragment of the open tool call's arguments (JSON text, as the upstream streamed it)."""

    index: int
    arguments: str


@dataclass(frozen=True, slots=True)
class ToolCallEnd:
    """The open tool call is complete; ``arguments`` is all of it: one JSON object (``{}``
    when the upstream sent none)."""

    index: int
    arguments: str


@dataclass(frozen=True, slots=True)
class Finish:
    """The answer ended cleanly. ``stop_sequence`` is the stop string that ended it when the
    upstream says which (vLLM's ``stop_reason``); ``usage`` is ``None`` when it reported none."""

    reason: FinishReason
    stop_sequence: str | None = None
    usage: TokenUsage | None = None


@dataclass(frozen=True, slots=True)
class Failure:
    """The answer broke off: ``code`` is the edge's error code (``upstream_error``,
    ``upstream_timeout``...), ``message`` what the client may read."""

    code: str
    message: str


AnswerEvent = (
    Start
    | TextDelta
    | ReasoningDelta
    | ToolCallStart
    | ToolCallDelta
    | ToolCallEnd
    | Finish
    | Failure
)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call of a whole answer (``call_id`` ``""``: the upstream gave none)."""

    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Answer:
    """A whole answer in the internal form: what a non-streamed chat completion says, or what
    a decoded stream adds up to (:class:`AnswerBuilder`)."""

    answer_id: str
    text: str
    reasoning: str
    tool_calls: tuple[ToolCall, ...]
    finish: Finish


@dataclass(slots=True)
class AnswerBuilder:
    """Folds a decoded stream into its :class:`Answer` (texts concatenated, tool calls in
    order), for a surface that must also keep or check the whole answer."""

    answer_id: str = ""
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    open_call: ToolCallStart | None = None
    finish: Finish | None = None
    failure: Failure | None = None

    def add(self, event: AnswerEvent) -> None:
        """Take one event of the stream."""
        if isinstance(event, Start):
            self.answer_id = event.answer_id
        elif isinstance(event, TextDelta):
            self.text.append(event.text)
        elif isinstance(event, ReasoningDelta):
            self.reasoning.append(event.text)
        elif isinstance(event, ToolCallStart):
            self.open_call = event
        elif isinstance(event, ToolCallEnd):
            opened = self.open_call
            if opened is None or opened.index != event.index:
                raise ValueError(f"tool call {event.index} ended without having started")
            self.calls.append(ToolCall(opened.call_id, opened.name, event.arguments))
            self.open_call = None
        elif isinstance(event, Finish):
            self.finish = event
        elif isinstance(event, Failure):
            self.failure = event

    def answer(self) -> Answer:
        """The whole answer; raises ValueError when the stream failed or has not finished."""
        if self.failure is not None:
            raise ValueError(f"the answer failed: {self.failure.message}")
        if self.finish is None:
            raise ValueError("the answer has not finished")
        return Answer(
            self.answer_id,
            "".join(self.text),
            "".join(self.reasoning),
            tuple(self.calls),
            self.finish,
        )
