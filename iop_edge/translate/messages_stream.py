"""A decoded answer rendered as Anthropic's Messages event stream.

The grammar, event for event (``index`` counts the blocks 0, 1, 2… in the order they open,
and a block is closed before the next one opens)::

    message_start        a Message with empty content, stop_reason null, and usage
    ( content_block_start   {"type": "text", "text": ""}
                            | {"type": "thinking", "thinking": "", "signature": ""}
                            | {"type": "tool_use", "id", "name", "input": {}}
      content_block_delta*  text_delta | thinking_delta | input_json_delta (partial_json:
                            the tool's arguments as they stream)
      [content_block_delta  signature_delta]   (a thinking block, just before its stop)
      content_block_stop )*
    message_delta        {"stop_reason", "stop_sequence"} and usage
    message_stop

A failure after ``message_start`` ends the stream with one ``error`` event
(``{"type": "error", "error": {"type", "message"}}``, the type from
:mod:`iop_edge.translate.anthropic_errors`) and never with ``message_stop``: the open block is
left open, as Anthropic does, and every client raises. ``ping`` events come from the shell
(:data:`PING`), whenever it waits.

Usage: the upstream reports its usage only in its last chunk, so ``message_start`` carries the
edge's estimate of the request's input tokens (``output_tokens`` 0), and ``message_delta`` the
exact figures — ``input_tokens`` (and ``cache_read_input_tokens``) when the upstream reported
them, ``output_tokens`` always (the upstream's count, else the edge's estimate: see
:mod:`iop_edge.translate.messages_reply`). Clients take ``message_delta``'s counts over
``message_start``'s, so the final Message has the exact figures; a client reading only
``message_start`` sees the estimate.

The Message's id, the tool-use ids, the thinking signatures, the stop reason and the usage are
those :func:`~iop_edge.translate.messages_reply.render_message` gives the same answer whole, so
a streamed answer accumulates to exactly the non-streamed Message (a test holds it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final, Literal

from iop_edge.translate.anthropic_errors import anthropic_error, error_payload
from iop_edge.translate.chat_events import ChatStreamDecoder
from iop_edge.translate.events import (
    AnswerEvent,
    Failure,
    Finish,
    ReasoningDelta,
    Start,
    TextDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
)
from iop_edge.translate.messages_reply import (
    anthropic_usage,
    message_id,
    stop_reason,
    text_bytes,
    thinking_signature,
    tool_use_id,
)
from iop_edge.translate.sse import encode_events

__all__ = ["PING", "MessageStreamRenderer", "MessagesStreamTranslator", "StreamEvent", "ping"]

#: One event of the stream: its name and its data.
StreamEvent = tuple[str, dict[str, Any]]
_Block = Literal["text", "thinking", "tool_use"]

PING: Final = b'event: ping\ndata: {"type":"ping"}\n\n'


def ping() -> bytes:
    """A ``ping`` event, for the shell to send while the request waits."""
    return PING


class MessageStreamRenderer:
    """Renders one answer's events (:mod:`iop_edge.translate.events`) as Messages events.

    ``model`` is the model the client asked for; ``estimated_input_tokens`` the edge's
    estimate of the request (``message_start``'s usage); ``stop_sequences`` the client's.
    ``message_start`` goes out with the first event, its id made from the upstream's chat id
    (as the whole Message's), unless the shell called :meth:`start` before, with an id of its
    own, to send pings behind it while it waits.
    """

    __slots__ = (
        "_block",
        "_calls",
        "_done",
        "_estimate",
        "_id",
        "_index",
        "_model",
        "_output",
        "_stops",
        "_thinking",
    )

    def __init__(
        self, *, model: str, estimated_input_tokens: int, stop_sequences: Sequence[str] = ()
    ) -> None:
        self._model = model
        self._estimate = estimated_input_tokens
        self._stops = tuple(stop_sequences)
        self._id: str | None = None
        self._block: _Block | None = None
        self._index = -1  # the open (or last) block's index
        self._calls = 0  # tool calls begun
        self._thinking: list[str] = []  # the open thinking block's text (for its signature)
        self._output = 0  # UTF-8 bytes of answer (the output estimate, when none is reported)
        self._done = False

    @property
    def started(self) -> bool:
        """Whether ``message_start`` has been rendered (a failure is then an ``error`` event,
        no longer an error status)."""
        return self._id is not None

    @property
    def done(self) -> bool:
        """Whether the stream has ended (``message_stop`` or ``error``)."""
        return self._done

    def start(self, identifier: str) -> list[StreamEvent]:
        """``message_start`` with the Message id ``identifier`` (nothing if already sent)."""
        if self._id is not None:
            return []
        self._id = identifier
        message: dict[str, Any] = {
            "id": identifier,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self._estimate, "output_tokens": 0},
        }
        return [("message_start", {"type": "message_start", "message": message})]

    def render_all(self, events: Iterable[AnswerEvent]) -> list[StreamEvent]:
        """The Messages events of several answer events, in order."""
        rendered: list[StreamEvent] = []
        for event in events:
            rendered += self.render(event)
        return rendered

    def render(self, event: AnswerEvent) -> list[StreamEvent]:
        """The Messages events of one answer event (nothing once the stream has ended)."""
        if self._done:
            return []
        out: list[StreamEvent] = []
        if self._id is None:
            out = self.start(message_id(event.answer_id if isinstance(event, Start) else ""))
        if isinstance(event, TextDelta):
            self._open("text", out)
            self._output += text_bytes(event.text)
            out.append(self._delta({"type": "text_delta", "text": event.text}))
        elif isinstance(event, ReasoningDelta):
            self._open("thinking", out)
            self._thinking.append(event.text)
            self._output += text_bytes(event.text)
            out.append(self._delta({"type": "thinking_delta", "thinking": event.text}))
        elif isinstance(event, ToolCallStart):
            assert self._id is not None
            block = {
                "type": "tool_use",
                "id": tool_use_id(event.call_id, self._id, self._calls),
                "name": event.name,
                "input": {},
            }
            self._calls += 1
            self._open("tool_use", out, block)
        elif isinstance(event, ToolCallDelta):
            if self._block != "tool_use":
                raise ValueError(f"arguments of tool call {event.index}, which is not open")
            out.append(self._delta({"type": "input_json_delta", "partial_json": event.arguments}))
        elif isinstance(event, ToolCallEnd):
            self._output += text_bytes(event.arguments)
            self._close(out)
        elif isinstance(event, Finish):
            self._close(out)
            reason, sequence = stop_reason(event, self._stops)
            usage = anthropic_usage(event.usage, self._estimate, self._output)
            if event.usage is None or event.usage.prompt_tokens is None:
                del usage["input_tokens"]  # (message_start's estimate stands)
            delta = {"stop_reason": reason, "stop_sequence": sequence}
            out.append(("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
            out.append(("message_stop", {"type": "message_stop"}))
            self._done = True
        elif isinstance(event, Failure):
            out += self.fail(event.code, event.message)
        return out

    def fail(self, code: str, message: str) -> list[StreamEvent]:
        """The ``error`` event that ends the stream (``code``: the edge's error code)."""
        if self._done:
            return []
        self._done = True
        kind, _ = anthropic_error(code)
        return [("error", error_payload(kind, message))]

    def _delta(self, delta: dict[str, Any]) -> StreamEvent:
        return (
            "content_block_delta",
            {"type": "content_block_delta", "index": self._index, "delta": delta},
        )

    def _open(
        self, kind: _Block, out: list[StreamEvent], block: dict[str, Any] | None = None
    ) -> None:
        if self._block == kind and block is None:
            return
        self._close(out)
        self._block = kind
        self._index += 1
        if block is None:
            block = (
                {"type": "text", "text": ""}
                if kind == "text"
                else {"type": "thinking", "thinking": "", "signature": ""}
            )
        out.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": self._index, "content_block": block},
            )
        )

    def _close(self, out: list[StreamEvent]) -> None:
        if self._block is None:
            return
        if self._block == "thinking":
            signature = thinking_signature("".join(self._thinking))
            self._thinking = []
            out.append(self._delta({"type": "signature_delta", "signature": signature}))
        self._block = None
        out.append(("content_block_stop", {"type": "content_block_stop", "index": self._index}))


class MessagesStreamTranslator:
    """The adapter's chat frames in, the Messages stream's bytes out: a
    :class:`~iop_edge.translate.chat_events.ChatStreamDecoder` and a
    :class:`MessageStreamRenderer` together, for the shell's relay loop."""

    __slots__ = ("decoder", "failure", "renderer")

    def __init__(
        self, *, model: str, estimated_input_tokens: int, stop_sequences: Sequence[str] = ()
    ) -> None:
        #: the failure the decoded answer ended with (its ``error`` event rendered), if any
        self.failure: Failure | None = None
        self.decoder = ChatStreamDecoder()
        self.renderer = MessageStreamRenderer(
            model=model,
            estimated_input_tokens=estimated_input_tokens,
            stop_sequences=stop_sequences,
        )

    @property
    def done(self) -> bool:
        """Whether the stream has ended (``message_stop`` or ``error`` rendered)."""
        return self.renderer.done

    def feed(self, frames: bytes) -> bytes:
        """The stream's bytes for a batch of the adapter's frames (may be empty)."""
        return self._render(self.decoder.feed_frames(frames))

    def end(self) -> bytes:
        """The adapter's frames ended cleanly: the stream's last bytes."""
        return self._render(self.decoder.end())

    def _render(self, events: list[AnswerEvent]) -> bytes:
        if events and isinstance(events[-1], Failure):  # (a failure is always the last)
            self.failure = events[-1]
        return encode_events(self.renderer.render_all(events))

    def fail(self, code: str, message: str) -> bytes:
        """The adapter failed (``code``: the edge's error code): the ``error`` event."""
        return encode_events(self.renderer.fail(code, message))
