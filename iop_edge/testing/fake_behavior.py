"""What a fake upstream does with one request, and how a request asks for it.

- :class:`FakeBehavior`: latency, chunking, status, faults and hold for one request;
  :data:`DEFAULT_BEHAVIOR` is a prompt, correct answer.
- Per-request overrides are a query string of its field names
  (:meth:`FakeBehavior.with_overrides`, :meth:`FakeBehavior.to_query`), carried by the
  :data:`BEHAVIOR_HEADER` header or by a :data:`DIRECTIVE_PREFIX` directive in the last user
  message (:func:`apply_directive`).

Pure: no I/O; :class:`~iop_edge.testing.fake_upstream.FakeUpstream` applies these to requests.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any, Literal, get_args
from urllib.parse import parse_qsl, urlencode

__all__ = [
    "BEHAVIOR_HEADER",
    "DEFAULT_BEHAVIOR",
    "DIRECTIVE_PREFIX",
    "FakeBehavior",
    "Fault",
    "apply_directive",
    "split_reply",
]

Fault = Literal["disconnect", "reset", "stall", "malformed", "error"]
"""A failure a fake injects into one response (see :attr:`FakeBehavior.fault`)."""

BEHAVIOR_HEADER = "x-fake-behavior"
"""Request header carrying a per-request behaviour as a query string: ``status=500&latency=0.1``."""

DIRECTIVE_PREFIX = "[[fake:"
"""Opens a behaviour directive inside the last user message: ``[[fake:fault=reset]]``.

Headers set by a client do not reach an upstream through a proxy that rewrites requests (the
Ollama and CLI adapters build new ones), but the conversation does; the directive is removed
from the text before it is echoed.
"""

_FAULTS: frozenset[str] = frozenset(get_args(Fault))
_DEFAULT_ERROR_MESSAGE = "The fake upstream was told to fail this request."


def _parse_bool(value: str) -> bool:
    lowered = value.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{value!r} is not a boolean; use true or false")


def _parse_optional_int(value: str) -> int | None:
    return None if value in ("", "none") else int(value)


def _parse_optional_str(value: str) -> str | None:
    return None if value == "" else value


def _parse_fault(value: str) -> str | None:
    if value in ("", "none"):
        return None
    if value not in _FAULTS:
        raise ValueError(f"{value!r} is not a fault; use one of {', '.join(sorted(_FAULTS))}")
    return value


_FIELD_PARSERS: dict[str, Callable[[str], object]] = {
    "reply": _parse_optional_str,
    "chunks": _parse_optional_int,
    "latency": float,
    "first_chunk_delay": float,
    "chunk_delay": float,
    "status": int,
    "error_message": str,
    "error_code": _parse_optional_str,
    "retry_after": _parse_optional_str,
    "fault": _parse_fault,
    "fault_after": int,
    "hold": _parse_bool,
    "thinking": _parse_optional_str,
    "tool_call": _parse_optional_str,
}


@dataclass(frozen=True, slots=True)
class FakeBehavior:
    """What a fake upstream does with one request; the default is a prompt, correct answer.

    Timing (seconds, real time — these are fakes of slow servers, not test synchronisation):

    - ``latency``: before the status line (time to response headers).
    - ``first_chunk_delay``: after the headers, before the first body frame ("slow first byte";
      for a non-streaming reply the body is sent as two halves around this delay).
    - ``chunk_delay``: between body frames.

    Content: ``reply`` fixes the text (``None`` echoes the request); ``chunks`` is the number of
    content chunks in a stream (``None``: one per word; more chunks than characters gives empty
    chunks, so the count is always exact).

    Errors: ``status`` other than 200 answers at once (after ``latency``) with the protocol's
    error body carrying ``error_message`` (and ``error_code`` in the OpenAI envelope), and a
    ``Retry-After`` header when ``retry_after`` is set (its value as is: seconds or a date).

    ``fault`` breaks the response after ``fault_after`` body frames have been written (0: right
    after the headers). A *frame* is one SSE event or NDJSON line of a stream; a non-streaming
    body counts as two frames, its halves. An OpenAI chat stream is: the role frame, the
    content frames, the finish frame, the usage frame (with ``include_usage``), ``[DONE]``.

    - ``disconnect``: close the connection before any response byte (ignores ``fault_after``).
    - ``reset``: close the connection mid-body (no final chunk; the client sees a truncated
      response).
    - ``stall``: stop writing and wait forever, until the client disconnects or the fake closes.
    - ``malformed``: write a frame that is not valid JSON (or a truncated non-streaming body),
      then end the response normally.
    - ``error``: write the protocol's in-stream error frame (OpenAI ``data: {"error": ...}``,
      Ollama ``{"error": ...}``), then end normally; a non-streaming request gets ``status``
      500 instead.

    ``hold`` parks the request (counted in flight) until
    :meth:`~iop_edge.testing.fake_upstream.FakeUpstream.release`.

    Parts besides the text, answered by the fake OpenAI server's chat (``reasoning_content``
    and ``tool_calls``, with ``finish_reason: "tool_calls"``) and its Anthropic Messages routes
    (:mod:`~iop_edge.testing.fake_messages`; the other protocols ignore them): ``thinking``, the
    reasoning that comes first; ``tool_call``, a tool call that comes last (unless the answer
    was cut by its length), written ``NAME`` or ``NAME:{"the": "input as a JSON object"}``.

    Per-request overrides use a query string of these field names (see :meth:`with_overrides`
    and :meth:`to_query`); values ``none`` or empty reset ``reply``, ``chunks``, ``fault``.
    """

    reply: str | None = None
    chunks: int | None = None
    latency: float = 0.0
    first_chunk_delay: float = 0.0
    chunk_delay: float = 0.0
    status: int = 200
    error_message: str = _DEFAULT_ERROR_MESSAGE
    error_code: str | None = None
    retry_after: str | None = None
    fault: Fault | None = None
    fault_after: int = 0
    hold: bool = False
    thinking: str | None = None
    tool_call: str | None = None

    def __post_init__(self) -> None:
        problems: list[str] = []
        if self.chunks is not None and self.chunks < 0:
            problems.append(f"chunks: {self.chunks} is negative; it must be >= 0")
        for name in ("latency", "first_chunk_delay", "chunk_delay"):
            value = getattr(self, name)
            if value < 0:
                problems.append(f"{name}: {value} is negative; it must be >= 0")
        if not 200 <= self.status <= 599:
            problems.append(f"status: {self.status} is not an HTTP status in 200..599")
        if self.fault is not None and self.fault not in _FAULTS:
            problems.append(f"fault: {self.fault!r} is not one of {sorted(_FAULTS)}")
        if self.fault_after < 0:
            problems.append(f"fault_after: {self.fault_after} is negative; it must be >= 0")
        if self.tool_call is not None:
            problems.extend(_tool_call_problems(self.tool_call))
        if problems:
            raise ValueError("; ".join(problems))

    def with_overrides(self, query: str) -> FakeBehavior:
        """Return a copy with the fields named in ``query`` (``a=1&b=2``, URL-encoded) replaced.

        Raises :class:`ValueError` naming the field for an unknown name or a bad value.
        """
        changes: dict[str, Any] = {}
        for name, raw in parse_qsl(query, keep_blank_values=True):
            parse = _FIELD_PARSERS.get(name)
            if parse is None:
                known = ", ".join(_FIELD_PARSERS)
                raise ValueError(f"{name}: unknown fake behaviour field; known fields: {known}")
            try:
                changes[name] = parse(raw)
            except ValueError as exc:
                raise ValueError(f"{name}: {raw!r} is invalid: {exc}") from exc
        return replace(self, **changes) if changes else self

    def to_query(self) -> str:
        """Encode the fields that differ from the defaults, for :data:`BEHAVIOR_HEADER`."""
        default = DEFAULT_BEHAVIOR
        pairs: list[tuple[str, str]] = []
        for field in fields(self):
            value = getattr(self, field.name)
            if value == getattr(default, field.name):
                continue
            text = (
                "none"
                if value is None
                else str(value).lower()
                if isinstance(value, bool)
                else str(value)
            )
            pairs.append((field.name, text))
        return urlencode(pairs)

    def directive(self) -> str:
        """Return this behaviour as a directive to put in a user message (``[[fake:...]]``)."""
        return f"{DIRECTIVE_PREFIX}{self.to_query()}]]"


def _tool_call_problems(tool_call: str) -> list[str]:
    name, colon, arguments = tool_call.partition(":")
    if not name:
        return [f"tool_call: {tool_call!r} has no tool name; write NAME or NAME:{{json}}"]
    if not colon:
        return []
    try:
        parsed = json.loads(arguments)
    except ValueError as exc:
        return [f"tool_call: the input of {name!r} is not JSON ({exc})"]
    if not isinstance(parsed, dict):
        return [f"tool_call: the input of {name!r} is not a JSON object"]
    return []


DEFAULT_BEHAVIOR = FakeBehavior()
"""The default behaviour: a prompt, correct answer."""


def apply_directive(behavior: FakeBehavior, prompt: str) -> tuple[FakeBehavior, str]:
    """Apply the first :data:`DIRECTIVE_PREFIX` directive in ``prompt``; remove it from the text.

    Returns ``behavior`` and ``prompt`` unchanged when there is no directive. Raises
    :class:`ValueError` for an unclosed directive or a bad field (see
    :meth:`FakeBehavior.with_overrides`).
    """
    start = prompt.find(DIRECTIVE_PREFIX)
    if start >= 0:
        end = prompt.find("]]", start)
        if end < 0:
            raise ValueError(f"{DIRECTIVE_PREFIX}: directive is not closed with ']]'")
        behavior = behavior.with_overrides(prompt[start + len(DIRECTIVE_PREFIX) : end])
        prompt = (prompt[:start] + prompt[end + 2 :]).strip()
    return behavior, prompt


def split_reply(text: str, chunks: int | None) -> list[str]:
    """Split ``text`` into ``chunks`` pieces (``None``: one per word, spaces kept).

    The pieces always join back to ``text``; with more chunks than characters some are empty.
    """
    if chunks is None:
        if not text:
            return []
        parts = text.split(" ")
        pieces = [part + " " for part in parts[:-1]]
        if parts[-1]:
            pieces.append(parts[-1])
        return pieces
    size = len(text)
    return [text[i * size // chunks : (i + 1) * size // chunks] for i in range(chunks)]
