"""A decoded answer rendered as OpenAI Responses' event stream.

Every event is ``event: <type>\\ndata: {"type": <type>, "sequence_number": n, …}`` with ``n``
counting the stream's events from 0. The grammar, event for event::

    response.created        the Response: status in_progress, empty output, usage null
    response.in_progress    the same
    ( response.output_item.added   the item (output_index: 0, 1, 2… in the order they open)
      for a message:     response.content_part.added   {"type": "output_text", "text": ""}
                         response.output_text.delta*   (content_index 0, logprobs [])
                         response.output_text.done     the whole text
                         response.content_part.done    the whole part
      for reasoning:     response.content_part.added   {"type": "reasoning_text", "text": ""}
                         response.reasoning_text.delta*
                         response.reasoning_text.done
                         response.content_part.done
      for a call:        response.function_call_arguments.delta*  (as the arguments stream)
                         response.function_call_arguments.done    the whole arguments
      response.output_item.done    the whole item )*
    response.completed      the whole Response (or response.incomplete, for a cut answer)

An item is done before the next one opens. The answer's events open an item of their kind
when none is open (a text delta a message, a reasoning delta a reasoning item, each call its
own ``function_call``), so the usual answer — reasoning, then text, then calls — streams the
items, ids and order that :func:`~iop_edge.translate.responses_reply.render_response` gives it
whole, and the last event's Response is exactly that rendering (a test holds it); an upstream
that interleaves text and reasoning gets an item per run, in its order.

A failure after the first event (an upstream that broke off, a timeout) ends the stream with
``response.failed``: the Response with status ``failed``, ``error`` ``{code, message}``
(:func:`~iop_edge.translate.responses_reply.response_error`) and the items so far (the open one
as it stood, status ``incomplete``) — never ``response.completed``; the open item is not closed,
as OpenAI leaves it. The SDK's ``stream.get_final_response()`` then raises.

The deltas, most of a stream, are written from bytes prepared when their item opens: one JSON
encoding of the delta's text per event.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

import orjson

from iop_edge.translate.chat_events import ChatStreamDecoder
from iop_edge.translate.events import (
    AnswerEvent,
    Failure,
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
)
from iop_edge.translate.messages_reply import text_bytes
from iop_edge.translate.responses_reply import (
    ENCRYPTED_REASONING,
    ResponseStatus,
    call_id_of,
    function_call_item,
    incomplete_details,
    item_id,
    message_item,
    output_text_part,
    reasoning_item,
    reasoning_text_part,
    response_core,
    response_error,
    response_object,
    response_usage,
)
from iop_edge.translate.sse import dumps

__all__ = ["ResponsesStreamRenderer", "ResponsesStreamTranslator"]

_Kind = Literal["message", "reasoning", "function_call"]
# (a tuple: isinstance with it is several times cheaper than with a `X | Y` union built per call)
_DELTAS: Final = (TextDelta, ReasoningDelta, ToolCallDelta)
_DELTA_OF: Final[dict[_Kind, str]] = {
    "message": "response.output_text.delta",
    "reasoning": "response.reasoning_text.delta",
    "function_call": "response.function_call_arguments.delta",
}


class _OpenItem:
    """The output item being streamed."""

    __slots__ = ("call_id", "head", "id", "index", "kind", "name", "parts")

    def __init__(self, kind: _Kind, identifier: str, index: int) -> None:
        self.kind = kind
        self.id = identifier
        self.index = index
        self.parts: list[str] = []  # its text (or arguments) so far
        self.call_id = ""
        self.name = ""
        # A delta event up to its text: `head + <JSON string> + tail(sequence number)`.
        name = _DELTA_OF[kind]
        fields = {"type": name, "item_id": identifier, "output_index": index}
        if kind != "function_call":
            fields["content_index"] = 0
        if kind == "message":
            fields["logprobs"] = []
        self.head = (
            b"event: " + name.encode() + b"\ndata: " + orjson.dumps(fields)[:-1] + b',"delta":'
        )

    def snapshot(self, status: ResponseStatus, *, sealed: bool) -> dict[str, Any]:
        """The item as it stands (``status`` for a message or call)."""
        text = "".join(self.parts)
        if self.kind == "message":
            return message_item(self.id, text, status)
        if self.kind == "reasoning":
            return reasoning_item(self.id, text, sealed=sealed)
        return function_call_item(self.id, self.call_id, self.name, text, status)


class ResponsesStreamRenderer:
    """Renders one answer's events (:mod:`iop_edge.translate.events`) as Responses events.

    ``response_id`` and ``created_at`` are the shell's, ``model`` the model the client asked
    for, ``echo`` the request's echoed fields, ``estimated_input_tokens`` the edge's estimate
    of the request (the usage when the upstream reports none), ``include`` the request's.
    ``response.created`` goes out with the first event, or before it when the shell calls
    :meth:`start` (to write the stream's head while the request waits).
    """

    __slots__ = (
        "_bytes",
        "_calls",
        "_core",
        "_echo",
        "_estimate",
        "_model",
        "_open",
        "_output",
        "_sealed",
        "_sequence",
        "created_at",
        "failure",
        "response",
        "response_id",
        "response_json",
    )

    def __init__(
        self,
        *,
        response_id: str,
        created_at: int,
        model: str,
        echo: Mapping[str, Any],
        estimated_input_tokens: int,
        include: Sequence[str] = (),
    ) -> None:
        self.response_id = response_id
        self.created_at = created_at
        self._model = model
        self._echo = echo
        self._estimate = estimated_input_tokens
        self._sealed = ENCRYPTED_REASONING in include
        self._core = response_core(response_id)
        self._sequence = -1  # the last event's number (-1: nothing sent)
        self._output: list[dict[str, Any]] = []  # the items done
        self._open: _OpenItem | None = None
        self._calls = 0  # function calls opened
        self._bytes = 0  # UTF-8 bytes of the answer (the output estimate, when none is reported)
        self.response: dict[str, Any] | None = None
        """The last event's Response once the stream has ended: completed, incomplete or
        failed (its ``status`` says which), for the store."""
        self.response_json: bytes | None = None
        """:attr:`response` as JSON, as the last event carried it (encoded once)."""
        self.failure: Failure | None = None
        """What ended the stream when it failed (``None``: it did not, or has not ended)."""

    @property
    def started(self) -> bool:
        """Whether ``response.created`` has been rendered (a failure is then
        ``response.failed``, no longer an error status)."""
        return self._sequence >= 0

    @property
    def done(self) -> bool:
        """Whether the stream has ended (completed, incomplete or failed)."""
        return self.response is not None

    def _event(self, name: str, fields: dict[str, Any]) -> bytes:
        self._sequence += 1
        payload = {"type": name, "sequence_number": self._sequence, **fields}
        return b"event: " + name.encode() + b"\ndata: " + dumps(payload) + b"\n\n"

    def _response_event(self, name: bytes, response: bytes) -> bytes:
        """A lifecycle event around its Response's JSON, encoded once (the same bytes as
        :meth:`_event` of ``{"response": …}``: the names need no escaping)."""
        self._sequence += 1
        return b'event: %b\ndata: {"type":"%b","sequence_number":%d,"response":%b}\n\n' % (
            name,
            name,
            self._sequence,
            response,
        )

    def _response(self, status: ResponseStatus, **fields: Any) -> dict[str, Any]:
        return response_object(
            response_id=self.response_id,
            created_at=self.created_at,
            model=self._model,
            echo=self._echo,
            status=status,
            **fields,
        )

    def start(self) -> bytes:
        """``response.created`` and ``response.in_progress`` (nothing if already sent)."""
        if self.started:
            return b""
        response = dumps(self._response("in_progress", output=[], usage=None))
        return self._response_event(b"response.created", response) + self._response_event(
            b"response.in_progress", response
        )

    def render_all(self, events: Sequence[AnswerEvent]) -> bytes:
        """The stream's bytes for several answer events, in order."""
        return b"".join([self.render(event) for event in events])

    def render(self, event: AnswerEvent) -> bytes:
        """The stream's bytes for one answer event (nothing once the stream has ended)."""
        if self.response is not None:
            return b""
        out = self.start() if self._sequence < 0 else b""
        if isinstance(event, _DELTAS):
            item = self._open
            if isinstance(event, ToolCallDelta):
                text = event.arguments
                if item is None or item.kind != "function_call":
                    raise ValueError(f"arguments of tool call {event.index}, which is not open")
            else:
                text = event.text
                kind: _Kind = "message" if isinstance(event, TextDelta) else "reasoning"
                if item is None or item.kind != kind:
                    out += self._close()
                    item = self._open_item(kind)
                    out += self._added(item)
            item.parts.append(text)
            self._sequence += 1
            return b'%b%b%b,"sequence_number":%d}\n\n' % (
                out,
                item.head,
                dumps(text),
                self._sequence,
            )
        if isinstance(event, ToolCallStart):
            out += self._close()
            item = self._open_item("function_call")
            item.call_id = call_id_of(event.call_id, self._core, self._calls)
            item.name = event.name
            self._calls += 1
            return out + self._added(item)
        if isinstance(event, ToolCallEnd):
            item = self._open
            if item is None or item.kind != "function_call":
                raise ValueError(f"tool call {event.index} ended without having started")
            item.parts = [event.arguments]
            self._bytes += text_bytes(event.arguments)
            return out + self._close()
        if isinstance(event, Finish):
            return out + self._finish(event)
        if isinstance(event, Failure):
            return out + self.fail(event.code, event.message)
        return out  # (Start: the Response's id is the shell's)

    def _open_item(self, kind: _Kind) -> _OpenItem:
        index = len(self._output)
        prefix = {"message": "msg", "reasoning": "rs", "function_call": "fc"}[kind]
        item = self._open = _OpenItem(kind, item_id(prefix, self._core, index), index)
        return item

    def _added(self, item: _OpenItem) -> bytes:
        added = item.snapshot("in_progress", sealed=False)
        if item.kind != "function_call":
            added["content"] = []  # (its part is added next)
        out = self._event("response.output_item.added", {"output_index": item.index, "item": added})
        if item.kind == "function_call":
            return out
        part = output_text_part("") if item.kind == "message" else reasoning_text_part("")
        return out + self._event("response.content_part.added", self._part_fields(item, part))

    @staticmethod
    def _part_fields(item: _OpenItem, part: dict[str, Any]) -> dict[str, Any]:
        return {"item_id": item.id, "output_index": item.index, "content_index": 0, "part": part}

    def _close(self, status: ResponseStatus = "completed") -> bytes:
        """The events that complete the open item (nothing when none is open)."""
        item = self._open
        if item is None:
            return b""
        self._open = None
        done = item.snapshot(status, sealed=self._sealed)
        self._output.append(done)
        text = "".join(item.parts)
        if item.kind != "function_call":  # (a call's arguments are counted at its end)
            self._bytes += text_bytes(text)  # UTF-8 lengths add up: counted once, not per delta
        where = {"item_id": item.id, "output_index": item.index}
        if item.kind == "function_call":
            out = self._event("response.function_call_arguments.done", {**where, "arguments": text})
        elif item.kind == "message":
            out = self._event(
                "response.output_text.done",
                {**where, "content_index": 0, "text": text, "logprobs": []},
            )
            out += self._event(
                "response.content_part.done", self._part_fields(item, output_text_part(text))
            )
        else:
            out = self._event(
                "response.reasoning_text.done", {**where, "content_index": 0, "text": text}
            )
            out += self._event(
                "response.content_part.done", self._part_fields(item, reasoning_text_part(text))
            )
        return out + self._event(
            "response.output_item.done", {"output_index": item.index, "item": done}
        )

    def _finish(self, finish: Finish) -> bytes:
        incomplete = incomplete_details(finish)
        out = self._close("incomplete" if incomplete is not None else "completed")
        response = self._response(
            "incomplete" if incomplete is not None else "completed",
            output=self._output,
            usage=response_usage(finish.usage, self._estimate, self._bytes),
            incomplete=incomplete,
        )
        name = b"response.incomplete" if incomplete is not None else b"response.completed"
        self.response, self.response_json = response, dumps(response)
        return out + self._response_event(name, self.response_json)

    def fail(self, code: str, message: str) -> bytes:
        """``response.failed`` (after ``response.created`` when nothing was sent yet), which
        ends the stream; ``code`` is the edge's error code. Nothing once it has ended."""
        if self.response is not None:
            return b""
        out = self.start()
        output = list(self._output)
        if self._open is not None:
            output.append(self._open.snapshot("incomplete", sealed=self._sealed))
        response = self._response(
            "failed", output=output, usage=None, error=response_error(code, message)
        )
        self.failure = Failure(code, message)
        self.response, self.response_json = response, dumps(response)
        return out + self._response_event(b"response.failed", self.response_json)


class ResponsesStreamTranslator:
    """The adapter's chat frames in, the Responses stream's bytes out: a
    :class:`~iop_edge.translate.chat_events.ChatStreamDecoder` (its exactly framed batches
    split at once) and a :class:`ResponsesStreamRenderer` together, for the shell's relay
    loop. ``response`` is the stream's last Response once it has ended (for the store) and
    ``failure`` what ended it when it failed."""

    __slots__ = ("decoder", "renderer")

    def __init__(
        self,
        *,
        response_id: str,
        created_at: int,
        model: str,
        echo: Mapping[str, Any],
        estimated_input_tokens: int,
        include: Sequence[str] = (),
    ) -> None:
        self.decoder = ChatStreamDecoder()
        self.renderer = ResponsesStreamRenderer(
            response_id=response_id,
            created_at=created_at,
            model=model,
            echo=echo,
            estimated_input_tokens=estimated_input_tokens,
            include=include,
        )

    @property
    def done(self) -> bool:
        """Whether the stream has ended (completed, incomplete or failed)."""
        return self.renderer.done

    @property
    def response(self) -> dict[str, Any] | None:
        """The last event's Response once the stream has ended (its status says how)."""
        return self.renderer.response

    @property
    def response_json(self) -> bytes | None:
        """:attr:`response` as JSON, as the last event carried it."""
        return self.renderer.response_json

    @property
    def failure(self) -> Failure | None:
        """What ended the stream when it failed: the upstream's broken answer or :meth:`fail`."""
        return self.renderer.failure

    def start(self) -> bytes:
        """``response.created`` and ``response.in_progress`` now (the stream's head, while the
        request waits); nothing if already sent."""
        return self.renderer.start()

    def feed(self, frames: bytes) -> bytes:
        """The stream's bytes for a batch of the adapter's frames (may be empty)."""
        return self.renderer.render_all(self.decoder.feed_frames(frames))

    def end(self) -> bytes:
        """The adapter's frames ended cleanly: the stream's last bytes."""
        return self.renderer.render_all(self.decoder.end())

    def fail(self, code: str, message: str) -> bytes:
        """The adapter failed (``code``: the edge's error code): ``response.failed``."""
        return self.renderer.fail(code, message)
