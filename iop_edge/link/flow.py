"""Request streams and their flow control, sans-IO: :class:`StreamTable` (the edge's) and
:class:`SendCredit` (the node's). Both are plain state machines; the link's shell feeds them
frames and acts on what they return, and a peer's mistake is a
:class:`~iop_edge.link.protocol.LinkViolation`.

**Credit.** Only responses are flow-controlled (the edge holds a request's whole body before
sending it). A stream starts with ``window_bytes`` of credit; each ``RESP_CHUNK`` byte costs
one. The node *starts* a chunk message only while its credit is positive; a message already
started may finish, up to ``max_chunk_bytes``, so credit may go negative. The edge grants
``WINDOW`` credit once its consumer has taken :data:`GRANT_BYTES` (or half the window, when the
window is smaller) since the last grant. So the edge never buffers more than ``window_bytes +
max_chunk_bytes`` for one stream; everything it holds for a link (message parts being joined,
chunks not yet taken) is capped by ``max_link_buffer_bytes``.

**One request.** ``REQ`` → ``RESP_REPLY`` | ``RESP_ERROR`` | (``RESP_STREAM``, ``RESP_CHUNK``…,
``RESP_END`` | ``RESP_ERROR``); ``PROBE`` → ``PROBE_RESULT``. Exactly one terminal message, then
the id is retired. After a ``CANCEL`` the edge keeps the id until the node's terminal message:
frames for it stay legal, and are dropped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Literal

from iop_edge.link.protocol import KIB, TERMINAL, Flag, Frame, Kind, LinkViolation

if TYPE_CHECKING:
    from iop_edge.link.handshake import LinkLimits

__all__ = ["GRANT_BYTES", "SendCredit", "StreamPurpose", "StreamTable"]

GRANT_BYTES: Final = 64 * KIB
"""The edge grants credit once its consumer has taken this much since the last grant (half
the window when the window is smaller, so that a small window cannot stall)."""

StreamPurpose = Literal["reply", "stream", "probe"]
"""What a stream was opened for, which fixes the answers it may get: ``reply`` (a
non-streamed call or ``count_tokens``: ``RESP_REPLY`` or ``RESP_ERROR``), ``stream`` (a streamed
call: ``RESP_STREAM`` and its chunks too), ``probe`` (``PROBE_RESULT``)."""

_HEADS: Final[dict[str, frozenset[Kind]]] = {
    "reply": frozenset({Kind.RESP_REPLY, Kind.RESP_ERROR}),
    "stream": frozenset({Kind.RESP_REPLY, Kind.RESP_ERROR, Kind.RESP_STREAM}),
    "probe": frozenset({Kind.PROBE_RESULT}),
}
_AFTER_HEAD: Final = frozenset({Kind.RESP_CHUNK, Kind.RESP_END, Kind.RESP_ERROR})


class _Stream:
    """The edge's view of one open stream."""

    __slots__ = (
        "buffered",
        "cancelled",
        "credit",
        "ended",
        "heads",
        "part_kind",
        "part_meta",
        "part_size",
        "parts",
        "streaming",
        "untaken",
    )

    def __init__(self, purpose: StreamPurpose, window: int) -> None:
        self.heads = _HEADS[purpose]
        self.streaming = False
        self.credit = window
        self.untaken = 0
        """Bytes the consumer took since the last grant."""
        self.buffered = 0
        """Bytes of complete chunks the consumer has not taken yet."""
        self.cancelled = False
        self.ended = False
        self.part_kind: Kind | None = None
        self.part_meta: dict[str, object] = {}
        self.part_size = 0
        self.parts: list[bytes] = []


class StreamTable:
    """The edge's request streams on one link: which ids are open, what each may receive
    next, its credit, and what the link buffers."""

    def __init__(self, limits: LinkLimits) -> None:
        self._limits = limits
        self._streams: dict[int, _Stream] = {}
        self._next_id = 1
        self._open = 0
        self._buffered = 0
        self._grant_at = max(1, min(GRANT_BYTES, limits.window_bytes // 2))
        self._caps = {
            Kind.RESP_REPLY: limits.max_reply_bytes,
            Kind.RESP_STREAM: limits.max_chunk_bytes,
            Kind.RESP_CHUNK: limits.max_chunk_bytes,
            Kind.RESP_END: limits.max_chunk_bytes,
            Kind.RESP_ERROR: limits.max_chunk_bytes,
            Kind.PROBE_RESULT: limits.max_frame_bytes,
        }

    @property
    def max_streams(self) -> int:
        """How many streams may be open at once (``max_streams`` of the limits)."""
        return self._limits.max_streams

    @property
    def open_streams(self) -> int:
        """Streams opened and not yet ended (cancelled ones included: the node still runs
        them until it sends their terminal message)."""
        return self._open

    @property
    def full(self) -> bool:
        """Whether :meth:`open` would refuse (``max_streams`` streams are open)."""
        return self._open >= self._limits.max_streams

    @property
    def buffered_bytes(self) -> int:
        """What the link holds now: message parts being joined and chunks not yet taken."""
        return self._buffered

    def open(self, purpose: StreamPurpose) -> int:
        """Open the next stream id (from 1, never reused) for a ``REQ`` or a ``PROBE``;
        :class:`OverflowError` when :attr:`full` (the caller checks it first)."""
        if self.full:
            raise OverflowError(
                f"{self._open} link streams are open; max_streams is {self._limits.max_streams}"
            )
        stream = self._next_id
        self._next_id += 1
        self._streams[stream] = _Stream(purpose, self._limits.window_bytes)
        self._open += 1
        return stream

    def is_open(self, stream: int) -> bool:
        """Whether ``stream`` is opened and not yet ended."""
        state = self._streams.get(stream)
        return state is not None and not state.ended

    def admit(self, frame: Frame) -> Frame | None:
        """Take a frame the node sent on a request stream.

        Returns the complete message when this frame ends one (the frame itself when it is
        whole): its meta the first frame's, its data joined. ``None`` while a message goes on,
        and for the messages of a cancelled stream but its terminal one. A chunk's bytes stay
        counted in :attr:`buffered_bytes` until :meth:`consumed`. Raises
        :class:`LinkViolation` for a stream never opened or already ended, a kind out of turn,
        a chunk begun without credit, a message over its cap or the link's buffer overflowing.
        """
        state = self._streams.get(frame.stream)
        if state is None or state.ended:
            raise self._not_open(frame)
        kind = frame.kind
        size = len(frame.data)
        if state.part_kind is None:
            allowed = _AFTER_HEAD if state.streaming else state.heads
            if kind not in allowed:
                raise LinkViolation(
                    "phase",
                    f"stream {frame.stream} got {kind.name}; it expects one of "
                    f"{_names(allowed)} now",
                )
            if kind is Kind.RESP_CHUNK and state.credit <= 0:
                raise LinkViolation(
                    "over_credit",
                    f"stream {frame.stream} began a RESP_CHUNK with {state.credit} bytes of "
                    f"credit; a chunk may begin only while credit is positive",
                )
            whole = not frame.flags & Flag.MORE
            if whole:
                self._check_cap(frame, size)
                message: Frame | None = frame
            else:
                state.part_kind = kind
                state.part_meta = frame.meta
                state.part_size = 0
                message = None
        elif kind is not state.part_kind:
            raise LinkViolation(
                "phase",
                f"stream {frame.stream} got {kind.name} in the middle of a "
                f"{state.part_kind.name} message (MORE was set)",
            )
        else:
            whole = False
            message = None
        if kind is Kind.RESP_CHUNK:
            state.credit -= size
        if not whole:
            message = self._join(state, frame, size)
        if message is None:
            return None
        return self._deliver(state, message)

    def consumed(self, stream: int, nbytes: int) -> int:
        """The consumer took ``nbytes`` of ``stream``'s chunks (its write returned). Returns the
        credit to grant now in a ``WINDOW`` (0: none yet)."""
        state = self._streams.get(stream)
        if state is None:
            return 0
        if nbytes > state.buffered:
            raise ValueError(
                f"stream {stream}: {nbytes} bytes consumed, but {state.buffered} are buffered"
            )
        state.buffered -= nbytes
        self._buffered -= nbytes
        if state.ended or state.cancelled:
            self._forget_if_done(stream, state)
            return 0
        state.untaken += nbytes
        if state.untaken < self._grant_at:
            return 0
        grant, state.untaken = state.untaken, 0
        state.credit += grant
        return grant

    def cancel(self, stream: int) -> bool:
        """The consumer is gone: drop what ``stream`` buffers. True when the node must be sent
        a ``CANCEL`` (the stream is still open, and was not cancelled before); the id is then
        kept until its terminal message, and everything else for it is dropped."""
        state = self._streams.get(stream)
        if state is None:
            return False
        self._buffered -= state.buffered
        state.buffered = 0
        if not state.cancelled:
            # A message being joined stops being stored; its size still counts against its cap.
            self._buffered -= state.part_size
            state.parts = []
        if state.ended:
            self._forget_if_done(stream, state)
            return False
        if state.cancelled:
            return False
        state.cancelled = True
        return True

    def _join(self, state: _Stream, frame: Frame, size: int) -> Frame | None:
        """Add a frame to the message being joined; the message once complete."""
        kind = frame.kind
        total = state.part_size + size
        self._check_cap(frame, total)
        if not state.cancelled:
            if self._buffered + size > self._limits.max_link_buffer_bytes:
                raise self._buffer_full(frame, size)
            self._buffered += size
            state.parts.append(frame.data)
        state.part_size = total
        if frame.flags & Flag.MORE:
            return None
        data = b"".join(state.parts)
        if not state.cancelled:
            self._buffered -= total
        message = Frame(kind, Flag(0), frame.stream, state.part_meta, data)
        state.part_kind = None
        state.part_meta = {}
        state.part_size = 0
        state.parts = []
        return message

    def _deliver(self, state: _Stream, message: Frame) -> Frame | None:
        """Account for a complete message and hand it on (or drop it: a cancelled stream)."""
        kind = message.kind
        if kind is Kind.RESP_STREAM:
            state.streaming = True
        if kind in TERMINAL:
            state.ended = True
            self._open -= 1
            self._forget_if_done(message.stream, state)
            return message
        if state.cancelled:
            return None
        if kind is Kind.RESP_CHUNK:
            size = len(message.data)
            if self._buffered + size > self._limits.max_link_buffer_bytes:
                raise self._buffer_full(message, size)
            self._buffered += size
            state.buffered += size
        return message

    def _check_cap(self, frame: Frame, total: int) -> None:
        cap = self._caps[frame.kind]
        if total > cap:
            raise LinkViolation(
                "message_too_large",
                f"a {frame.kind.name} message on stream {frame.stream} reached {total} bytes; "
                f"its cap is {cap}",
            )

    def _buffer_full(self, frame: Frame, size: int) -> LinkViolation:
        return LinkViolation(
            "buffer_full",
            f"{size} more bytes on stream {frame.stream} would make the link buffer "
            f"{self._buffered + size} bytes; max_link_buffer_bytes is "
            f"{self._limits.max_link_buffer_bytes}",
        )

    def _forget_if_done(self, stream: int, state: _Stream) -> None:
        if state.ended and state.buffered == 0:
            self._streams.pop(stream, None)

    def _not_open(self, frame: Frame) -> LinkViolation:
        if 1 <= frame.stream < self._next_id:
            return LinkViolation(
                "closed_stream",
                f"a {frame.kind.name} on stream {frame.stream}, which has already ended",
            )
        return LinkViolation(
            "unknown_stream",
            f"a {frame.kind.name} on stream {frame.stream}, which the edge never opened "
            f"(the last it opened is {self._next_id - 1})",
        )


def _names(kinds: frozenset[Kind]) -> str:
    return ", ".join(sorted(k.name for k in kinds))


class SendCredit:
    """The node's side of its request streams: which ids the edge opened, each one's ``REQ``
    being joined, and its credit for response chunks."""

    def __init__(self, limits: LinkLimits) -> None:
        self._limits = limits
        self._credit: dict[int, int] = {}
        self._parts: dict[int, tuple[Frame, list[bytes], int]] = {}
        self._last_id = 0

    @property
    def open_streams(self) -> int:
        """Streams the edge opened that have not ended yet."""
        return len(self._credit)

    def admit_request(self, frame: Frame) -> Frame | None:
        """Take a ``REQ`` or ``PROBE`` frame: its first frame opens the stream (the id must be
        new: above every earlier one, within ``max_streams``). Returns the complete message,
        or ``None`` while it goes on; :class:`LinkViolation` otherwise."""
        stream = frame.stream
        pending = self._parts.get(stream)
        if pending is None:
            self._open(frame)
            if not frame.flags & Flag.MORE:
                self._check_cap(frame, len(frame.data))
                return frame
            self._parts[stream] = (frame, [frame.data], len(frame.data))
            self._check_cap(frame, len(frame.data))
            return None
        first, parts, size = pending
        if frame.kind is not first.kind:
            raise LinkViolation(
                "phase",
                f"stream {stream} got {frame.kind.name} in the middle of a {first.kind.name} "
                f"message (MORE was set)",
            )
        size += len(frame.data)
        self._check_cap(frame, size)
        parts.append(frame.data)
        if frame.flags & Flag.MORE:
            self._parts[stream] = (first, parts, size)
            return None
        del self._parts[stream]
        return Frame(first.kind, Flag(0), stream, first.meta, b"".join(parts))

    def is_open(self, stream: int) -> bool:
        """Whether ``stream`` is open: False once it ended (a ``WINDOW`` or ``CANCEL`` racing
        its terminal frame is then ignored); :class:`LinkViolation` for an id never opened."""
        if stream > self._last_id or stream < 1:
            raise LinkViolation(
                "unknown_stream",
                f"stream {stream} was never opened (the last the edge opened is {self._last_id})",
            )
        return stream in self._credit

    def credit(self, stream: int) -> int:
        """``stream``'s credit now (it may be negative after a large chunk)."""
        return self._credit[stream]

    def may_start(self, stream: int) -> bool:
        """Whether a chunk message may begin on ``stream`` (its credit is positive)."""
        return self._credit[stream] > 0

    def take(self, stream: int, nbytes: int) -> None:
        """Spend credit for ``nbytes`` of chunk data sent on ``stream``."""
        self._credit[stream] -= nbytes

    def grant(self, stream: int, increment: int) -> bool:
        """Add a ``WINDOW``'s credit. True when it lets a waiting chunk begin (the credit went
        from ≤ 0 to > 0); an ended stream's grant is ignored (False)."""
        if not self.is_open(stream):
            return False
        before = self._credit[stream]
        self._credit[stream] = before + increment
        return before <= 0 < before + increment

    def close(self, stream: int) -> None:
        """The node sent ``stream``'s terminal frame: the id is retired."""
        self._credit.pop(stream, None)
        self._parts.pop(stream, None)

    def _open(self, frame: Frame) -> None:
        stream = frame.stream
        if stream <= self._last_id:
            raise LinkViolation(
                "stream_reused",
                f"a {frame.kind.name} opens stream {stream}, but ids only grow and the last "
                f"opened is {self._last_id}",
            )
        if len(self._credit) >= self._limits.max_streams:
            raise LinkViolation(
                "too_many_streams",
                f"a {frame.kind.name} opens stream {stream} with {len(self._credit)} streams "
                f"open; max_streams is {self._limits.max_streams}",
            )
        self._last_id = stream
        self._credit[stream] = self._limits.window_bytes

    def _check_cap(self, frame: Frame, total: int) -> None:
        cap = self._limits.max_request_bytes
        if total > cap:
            raise LinkViolation(
                "message_too_large",
                f"a {frame.kind.name} message on stream {frame.stream} reached {total} bytes; "
                f"max_request_bytes is {cap}",
            )
