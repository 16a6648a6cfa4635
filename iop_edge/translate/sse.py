"""Server-sent events, both ways: reading the adapters' chat frames, writing a surface's events.

Reading follows the WHATWG event-stream rules the surfaces rely on: lines end in ``\\n`` or
``\\r\\n``; ``data:`` lines of one event are joined with ``\\n``; an ``event:`` line names it;
comment lines (``:``) and other fields are skipped; a blank line dispatches an event that has
data. Bytes may arrive cut anywhere: a partial line waits for the next :meth:`SseReader.feed`.

Writing produces ``event: <name>\\ndata: <compact JSON>\\n\\n``, the framing Anthropic's
Messages stream and OpenAI's Responses stream both use.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["SseMessage", "SseReader", "dumps", "encode_event", "encode_events"]


@dataclass(frozen=True, slots=True)
class SseMessage:
    """One dispatched event: its ``event:`` name (``None`` when it had none) and its data."""

    event: str | None
    data: bytes


class SseReader:
    """Incremental reader of an event stream (see the module docstring)."""

    __slots__ = ("_buffer", "_data", "_event")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._data: list[bytes] = []
        self._event: str | None = None

    def feed(self, chunk: bytes) -> list[SseMessage]:
        """The events that ``chunk`` completes, in order."""
        # Lines are sliced from one bytes object: a slice of the bytearray, then its bytes(),
        # would copy each line twice. Usually nothing is held and the chunk itself is read.
        if self._buffer:
            self._buffer += chunk
            buffer = bytes(self._buffer)
        else:
            buffer = bytes(chunk)
        messages: list[SseMessage] = []
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            line = buffer[start:end]
            start = end + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self._data:
                    messages.append(SseMessage(self._event, b"\n".join(self._data)))
                self._data = []
                self._event = None
                continue
            name, _, value = line.partition(b":")
            if value.startswith(b" "):
                value = value[1:]
            if name == b"data":
                self._data.append(value)
            elif name == b"event":
                self._event = value.decode("utf-8", "replace")
            # (a comment has an empty name; id and retry mean nothing to a translation)
        self._buffer = bytearray(buffer[start:])
        return messages

    @property
    def pending(self) -> bool:
        """Whether bytes or data of an undispatched event are held (a stream cut mid-event)."""
        return bool(self._buffer or self._data)


def dumps(value: Any) -> bytes:
    """Compact JSON; falls back to :mod:`json` for what orjson refuses (an integer beyond 64
    bits, which a client may legitimately send inside a tool's input)."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def encode_event(name: str, payload: Mapping[str, Any]) -> bytes:
    """One event as the bytes of the stream."""
    return b"event: " + name.encode() + b"\ndata: " + dumps(payload) + b"\n\n"


def encode_events(events: Iterable[tuple[str, Mapping[str, Any]]]) -> bytes:
    """Several ``(name, payload)`` events as the bytes of the stream, in order."""
    return b"".join(encode_event(name, payload) for name, payload in events)
