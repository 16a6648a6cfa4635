"""Reading an event stream (:class:`iop_edge.translate.sse.SseReader`): the WHATWG rules the
surfaces rely on, whatever way the bytes are cut."""

from __future__ import annotations

from iop_edge.translate.sse import SseMessage, SseReader, encode_event

STREAM = (
    b": a comment\n"
    b"event: message_start\r\n"
    b'data: {"a":1}\r\n'
    b"\r\n"
    b"data: first line\n"
    b"data:second line\n"
    b"id: 7\n"
    b"retry: 10\n"
    b"\n"
    b"event: nothing\n"
    b"\n"
    b"data: [DONE]\n\n"
)
EXPECTED = [
    SseMessage("message_start", b'{"a":1}'),
    SseMessage(None, b"first line\nsecond line"),
    SseMessage(None, b"[DONE]"),
]


def test_events_are_read_by_the_rules_in_one_piece():
    reader = SseReader()
    assert reader.feed(STREAM) == EXPECTED
    assert not reader.pending


def test_events_are_read_alike_across_any_two_cuts():
    for first in range(len(STREAM)):
        for second in range(first, len(STREAM), 7):
            reader = SseReader()
            messages = reader.feed(STREAM[:first])
            messages += reader.feed(STREAM[first:second])
            messages += reader.feed(STREAM[second:])
            assert messages == EXPECTED, (first, second)
            assert not reader.pending


def test_a_cut_event_is_pending_until_its_blank_line():
    reader = SseReader()
    assert reader.feed(b"data: x") == []
    assert reader.pending  # (the partial line is held)
    assert reader.feed(b"\n") == []
    assert reader.pending  # (the data waits for the blank line)
    assert reader.feed(b"\n") == [SseMessage(None, b"x")]
    assert not reader.pending


def test_what_is_written_reads_back():
    raw = encode_event("ping", {"type": "ping"}) + encode_event("x", {"t": "é\n"})
    assert SseReader().feed(raw) == [
        SseMessage("ping", b'{"type":"ping"}'),
        SseMessage("x", '{"t":"é\\n"}'.encode()),
    ]
