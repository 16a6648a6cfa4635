"""Request streams and flow control (issue 29, design §2 "Flow control" and "One request"): the
edge's ``StreamTable`` and the node's ``SendCredit``, plain sync state machines."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from iop_edge.link.flow import GRANT_BYTES, SendCredit, StreamTable
from iop_edge.link.handshake import LinkLimits
from iop_edge.link.protocol import Flag, Frame, Kind, LinkViolation

LIMITS = LinkLimits(
    window_bytes=1000, max_chunk_bytes=3000, max_reply_bytes=5000, max_request_bytes=4000
)
MORE = Flag.MORE


def chunk(stream: int, data: bytes, *, more: bool = False) -> Frame:
    return Frame(Kind.RESP_CHUNK, MORE if more else Flag(0), stream, {}, data)


def violation(table: StreamTable, frame: Frame) -> LinkViolation:
    with pytest.raises(LinkViolation) as caught:
        table.admit(frame)
    return caught.value


def streaming(table: StreamTable) -> int:
    """A stream opened for a streamed call whose head has arrived."""
    stream = table.open("stream")
    table.admit(Frame(Kind.RESP_STREAM, stream=stream, meta={"status": 200}, data=b"first"))
    return stream


# --- the edge: StreamTable -------------------------------------------------------------------


def test_ids_start_at_1_and_are_never_reused():
    table = StreamTable(LIMITS)
    first = table.open("reply")
    table.admit(Frame(Kind.RESP_REPLY, stream=first, meta={"status": 200}))
    assert (first, table.open("reply"), table.open("probe")) == (1, 2, 3)


def test_a_whole_reply_is_handed_on_as_it_came_and_ends_the_stream():
    table = StreamTable(LIMITS)
    stream = table.open("reply")
    reply = Frame(Kind.RESP_REPLY, stream=stream, meta={"status": 200}, data=b"{}")
    assert table.admit(reply) is reply
    assert not table.is_open(stream)
    assert table.open_streams == 0
    assert table.buffered_bytes == 0


def test_a_reply_over_several_frames_is_joined_with_its_first_meta():
    table = StreamTable(LIMITS)
    stream = table.open("reply")
    first = Frame(Kind.RESP_REPLY, MORE, stream, {"status": 200}, b"ab")
    assert table.admit(first) is None
    assert table.buffered_bytes == 2
    assert table.admit(Frame(Kind.RESP_REPLY, MORE, stream, {"ignored": 1}, b"cd")) is None
    assert table.buffered_bytes == 4
    whole = table.admit(Frame(Kind.RESP_REPLY, stream=stream, data=b"e"))
    assert whole == Frame(Kind.RESP_REPLY, Flag(0), stream, {"status": 200}, b"abcde")
    assert table.buffered_bytes == 0
    assert not table.is_open(stream)


def test_a_frame_for_a_stream_never_opened_or_already_ended_is_a_violation():
    table = StreamTable(LIMITS)
    stream = table.open("reply")
    never = violation(table, Frame(Kind.RESP_REPLY, stream=2))
    assert never.reason == "unknown_stream"
    assert "stream 2, which the edge never opened (the last it opened is 1)" in str(never)
    table.admit(Frame(Kind.RESP_REPLY, stream=stream))
    ended = violation(table, Frame(Kind.RESP_REPLY, stream=stream))
    assert ended.reason == "closed_stream"
    assert "stream 1, which has already ended" in str(ended)


@pytest.mark.parametrize(
    ("purpose", "before", "kind"),
    [
        ("reply", [], Kind.RESP_STREAM),
        ("reply", [], Kind.RESP_CHUNK),
        ("reply", [], Kind.PROBE_RESULT),
        ("stream", [], Kind.RESP_CHUNK),
        ("stream", [], Kind.RESP_END),
        ("stream", [Kind.RESP_STREAM], Kind.RESP_REPLY),
        ("stream", [Kind.RESP_STREAM], Kind.RESP_STREAM),
        ("probe", [], Kind.RESP_REPLY),
        ("probe", [], Kind.RESP_ERROR),
    ],
)
def test_a_kind_out_of_turn_is_a_phase_violation(purpose, before, kind):
    table = StreamTable(LIMITS)
    stream = table.open(purpose)
    for earlier in before:
        table.admit(Frame(earlier, stream=stream))
    caught = violation(table, Frame(kind, stream=stream))
    assert caught.reason == "phase"
    assert f"stream {stream} got {kind.name}; it expects one of" in str(caught)


def test_a_message_continued_by_another_kind_is_a_phase_violation():
    table = StreamTable(LIMITS)
    stream = streaming(table)
    table.admit(chunk(stream, b"x", more=True))
    caught = violation(table, Frame(Kind.RESP_END, stream=stream))
    assert caught.reason == "phase"
    assert "got RESP_END in the middle of a RESP_CHUNK message" in str(caught)


def test_a_streamed_call_runs_head_chunks_end():
    table = StreamTable(LIMITS)
    stream = table.open("stream")
    head = Frame(Kind.RESP_STREAM, stream=stream, meta={"status": 200}, data=b"first")
    assert table.admit(head) is head
    assert table.admit(chunk(stream, b"a")) == chunk(stream, b"a")
    assert table.buffered_bytes == 1
    end = Frame(Kind.RESP_END, stream=stream, meta={"usage": None})
    assert table.admit(end) is end
    assert not table.is_open(stream)
    assert table.buffered_bytes == 1  # (the consumer has not taken the chunk yet)
    assert table.consumed(stream, 1) == 0
    assert table.buffered_bytes == 0
    assert violation(table, chunk(stream, b"b")).reason == "closed_stream"


def test_a_probe_ends_with_its_result():
    table = StreamTable(LIMITS)
    stream = table.open("probe")
    result = Frame(Kind.PROBE_RESULT, stream=stream, meta={"ok": True, "reason": None})
    assert table.admit(result) is result
    assert not table.is_open(stream)


def test_a_chunk_may_begin_only_with_credit_and_may_then_overshoot():
    table = StreamTable(LIMITS)
    stream = streaming(table)
    table.admit(chunk(stream, b"x" * 999))
    # One byte of credit left: a chunk may begin, and finish past the window.
    table.admit(chunk(stream, b"x" * 1000, more=True))
    table.admit(chunk(stream, b"x" * 500))
    caught = violation(table, chunk(stream, b"x"))
    assert caught.reason == "over_credit"
    assert "began a RESP_CHUNK with -1499 bytes of credit" in str(caught)


def test_a_chunk_over_its_cap_is_a_violation():
    table = StreamTable(LIMITS)
    stream = streaming(table)
    table.admit(chunk(stream, b"x" * 2000, more=True))
    caught = violation(table, chunk(stream, b"x" * 1001))
    assert caught.reason == "message_too_large"
    assert "a RESP_CHUNK message on stream 1 reached 3001 bytes; its cap is 3000" in str(caught)


def test_a_reply_over_its_cap_is_a_violation():
    table = StreamTable(LIMITS)
    stream = table.open("reply")
    caught = violation(table, Frame(Kind.RESP_REPLY, stream=stream, data=b"x" * 5001))
    assert caught.reason == "message_too_large"


def test_credit_is_granted_once_the_consumer_took_half_a_small_window():
    table = StreamTable(LIMITS)
    stream = streaming(table)
    table.admit(chunk(stream, b"x" * 1000))
    assert table.consumed(stream, 499) == 0
    assert table.consumed(stream, 1) == 500
    assert table.admit(chunk(stream, b"y" * 10)) is not None  # (credit 500 again)
    assert table.consumed(stream, 499) == 0
    assert table.consumed(stream, 11) == 510


def test_a_large_window_grants_every_64_kib():
    limits = LinkLimits()
    table = StreamTable(limits)
    stream = streaming(table)
    table.admit(chunk(stream, b"x" * 100_000))
    assert table.consumed(stream, GRANT_BYTES - 1) == 0
    assert table.consumed(stream, 1) == GRANT_BYTES


def test_consuming_more_than_is_buffered_is_a_bug_of_the_caller():
    table = StreamTable(LIMITS)
    stream = streaming(table)
    table.admit(chunk(stream, b"abc"))
    with pytest.raises(ValueError, match="4 bytes consumed, but 3 are buffered"):
        table.consumed(stream, 4)


def test_the_link_buffer_cap_counts_every_stream():
    limits = LinkLimits(window_bytes=1000, max_chunk_bytes=3000, max_link_buffer_bytes=2500)
    table = StreamTable(limits)
    one, two, three = streaming(table), streaming(table), table.open("reply")
    table.admit(chunk(one, b"x" * 1000))
    table.admit(chunk(two, b"x" * 1000))
    table.admit(Frame(Kind.RESP_REPLY, MORE, three, {}, b"x" * 400))
    assert table.buffered_bytes == 2400
    caught = violation(table, Frame(Kind.RESP_REPLY, MORE, three, {}, b"x" * 101))
    assert caught.reason == "buffer_full"
    assert "would make the link buffer 2501 bytes; max_link_buffer_bytes is 2500" in str(caught)


def test_max_streams_counts_open_and_cancelled_streams_until_their_end():
    table = StreamTable(LinkLimits(max_streams=2))
    one, two = table.open("reply"), table.open("stream")
    assert table.full
    with pytest.raises(OverflowError, match="2 link streams are open; max_streams is 2"):
        table.open("reply")
    assert table.cancel(two)
    assert table.full
    table.admit(Frame(Kind.RESP_ERROR, stream=two, meta={"type": "cancelled"}))
    assert not table.full
    assert table.open("probe") == 3
    assert table.open_streams == 2
    assert table.is_open(one)


def test_a_cancelled_stream_is_kept_until_its_end_and_its_frames_are_dropped():
    table = StreamTable(LIMITS)
    stream = streaming(table)
    table.admit(chunk(stream, b"x" * 300))
    assert table.buffered_bytes == 300
    assert table.cancel(stream) is True
    assert table.buffered_bytes == 0  # (the consumer is gone: what it did not take is dropped)
    assert table.cancel(stream) is False  # (one CANCEL is enough)
    assert table.admit(chunk(stream, b"y" * 200)) is None
    assert table.admit(chunk(stream, b"z" * 100, more=True)) is None
    assert table.admit(chunk(stream, b"z")) is None
    assert table.buffered_bytes == 0
    # Still checked: credit is spent (700 - 301 = 399 left, then a chunk past it)...
    table.admit(chunk(stream, b"w" * 399))
    assert violation(table, chunk(stream, b"v")).reason == "over_credit"


def test_a_cancelled_streams_terminal_message_is_handed_on_then_the_id_ends():
    table = StreamTable(LIMITS)
    stream = streaming(table)
    table.cancel(stream)
    end = Frame(Kind.RESP_ERROR, stream=stream, meta={"type": "cancelled"})
    assert table.admit(end) is end
    assert violation(table, chunk(stream, b"x")).reason == "closed_stream"
    assert table.cancel(stream) is False


def test_cancelling_an_ended_stream_drops_its_chunks_and_sends_nothing():
    table = StreamTable(LIMITS)
    stream = streaming(table)
    table.admit(chunk(stream, b"x" * 10))
    table.admit(Frame(Kind.RESP_END, stream=stream))
    assert table.buffered_bytes == 10
    assert table.cancel(stream) is False
    assert table.buffered_bytes == 0


def test_a_cancelled_reply_being_joined_stops_being_stored():
    table = StreamTable(LIMITS)
    stream = table.open("reply")
    table.admit(Frame(Kind.RESP_REPLY, MORE, stream, {"status": 200}, b"x" * 100))
    assert table.buffered_bytes == 100
    table.cancel(stream)
    assert table.buffered_bytes == 0
    table.admit(Frame(Kind.RESP_REPLY, MORE, stream, {}, b"x" * 100))
    assert table.buffered_bytes == 0
    last = table.admit(Frame(Kind.RESP_REPLY, stream=stream, data=b"x"))
    assert last is not None
    assert last.kind is Kind.RESP_REPLY
    assert table.buffered_bytes == 0
    assert not table.is_open(stream)


# --- the node: SendCredit --------------------------------------------------------------------


def req(stream: int, data: bytes = b"{}", *, more: bool = False) -> Frame:
    return Frame(Kind.REQ, MORE if more else Flag(0), stream, {"op": "call"}, data)


def test_a_request_opens_its_stream_with_the_window():
    credit = SendCredit(LIMITS)
    frame = req(1)
    assert credit.admit_request(frame) is frame
    assert credit.is_open(1)
    assert credit.credit(1) == 1000
    assert credit.open_streams == 1


def test_a_request_over_several_frames_is_joined_up_to_its_cap():
    credit = SendCredit(LIMITS)
    assert credit.admit_request(req(1, b"ab", more=True)) is None
    assert credit.admit_request(Frame(Kind.REQ, MORE, 1, {}, b"cd")) is None
    joined = credit.admit_request(Frame(Kind.REQ, Flag(0), 1, {}, b"e"))
    assert joined == Frame(Kind.REQ, Flag(0), 1, {"op": "call"}, b"abcde")
    credit.admit_request(req(2, b"x" * 3000, more=True))
    with pytest.raises(LinkViolation, match="reached 4001 bytes; max_request_bytes is 4000") as c:
        credit.admit_request(Frame(Kind.REQ, Flag(0), 2, {}, b"x" * 1001))
    assert c.value.reason == "message_too_large"


def test_a_request_continued_by_another_kind_is_a_phase_violation():
    credit = SendCredit(LIMITS)
    credit.admit_request(req(1, more=True))
    with pytest.raises(LinkViolation, match="got PROBE in the middle of a REQ message") as c:
        credit.admit_request(Frame(Kind.PROBE, stream=1, meta={"provider": "p"}))
    assert c.value.reason == "phase"


def test_stream_ids_only_grow():
    credit = SendCredit(LIMITS)
    credit.admit_request(req(5))
    credit.close(5)
    for stream in (5, 3):
        with pytest.raises(LinkViolation, match=f"opens stream {stream}, but ids only grow") as c:
            credit.admit_request(req(stream))
        assert c.value.reason == "stream_reused"


def test_more_streams_than_max_streams_is_a_violation():
    credit = SendCredit(LinkLimits(max_streams=2))
    credit.admit_request(req(1))
    credit.admit_request(Frame(Kind.PROBE, stream=2))
    with pytest.raises(LinkViolation, match="with 2 streams open; max_streams is 2") as c:
        credit.admit_request(req(3))
    assert c.value.reason == "too_many_streams"
    credit.close(1)
    assert credit.admit_request(req(4)) is not None


def test_a_chunk_may_start_while_credit_is_positive_and_a_grant_wakes_it():
    credit = SendCredit(LIMITS)
    credit.admit_request(req(1))
    assert credit.may_start(1)
    credit.take(1, 999)
    assert credit.may_start(1)
    credit.take(1, 500)
    assert credit.credit(1) == -499
    assert not credit.may_start(1)
    assert credit.grant(1, 400) is False  # (still not positive)
    assert credit.grant(1, 100) is True
    assert credit.may_start(1)
    assert credit.grant(1, 100) is False  # (it was positive already)


def test_a_stream_never_opened_is_a_violation_and_an_ended_one_is_ignored():
    credit = SendCredit(LIMITS)
    credit.admit_request(req(1))
    with pytest.raises(LinkViolation, match="stream 2 was never opened") as c:
        credit.is_open(2)
    assert c.value.reason == "unknown_stream"
    with pytest.raises(LinkViolation, match="stream 0 was never opened"):
        credit.grant(0, 10)
    credit.close(1)
    assert credit.is_open(1) is False
    assert credit.grant(1, 10) is False  # (a WINDOW racing the terminal frame)


# --- both ends together ----------------------------------------------------------------------


@given(
    chunks=st.lists(st.integers(1, 3000), min_size=1, max_size=40),
    takes=st.lists(st.integers(0, 4000), min_size=1, max_size=40),
)
def test_a_node_keeping_the_rule_never_violates_and_the_edge_holds_a_window_and_a_chunk(
    chunks, takes
):
    """The node begins a chunk only while ``may_start``; the consumer takes what it likes;
    every grant reaches the node. No violation, every byte arrives in order, and the edge never
    holds more than ``window_bytes + max_chunk_bytes`` for the stream."""
    table, credit = StreamTable(LIMITS), SendCredit(LIMITS)
    stream = table.open("stream")
    credit.admit_request(req(stream))
    table.admit(Frame(Kind.RESP_STREAM, stream=stream))
    pending = [bytes([i % 251]) * size for i, size in enumerate(chunks)]
    sent, received = b"".join(pending), []
    held = 0
    step = 0
    while pending or held:
        while pending and credit.may_start(stream):
            data = pending.pop(0)
            # (a chunk of two bytes or more travels in two frames)
            halves = [part for part in (data[: len(data) // 2], data[len(data) // 2 :]) if part]
            for i, part in enumerate(halves):
                message = table.admit(chunk(stream, part, more=i < len(halves) - 1))
                credit.take(stream, len(part))
                if message is not None:
                    received.append(message.data)
                    held += len(message.data)
            assert table.buffered_bytes <= LIMITS.window_bytes + LIMITS.max_chunk_bytes
        take = min(held, takes[step % len(takes)] or 1)
        step += 1
        held -= take
        grant = table.consumed(stream, take)
        if grant:
            credit.grant(stream, grant)
        assert step < 10_000, "the stream stalled"
    assert b"".join(received) == sent
    assert table.buffered_bytes == 0
