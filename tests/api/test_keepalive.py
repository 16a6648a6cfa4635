"""The shared keep-alive ticker: one timer while streams wait, none otherwise; a stream's event
at the first tick at or after it is due, never before."""

from __future__ import annotations

from typing import Any

from iop_edge.api.keepalive import TICK, KeepaliveTicker
from iop_edge.testing.clock import FakeClock


class Waiting:
    """A stand-in for a waiting stream: its due time, and the times it was fired at."""

    def __init__(self, due: float) -> None:
        self.due = due
        self.fired: list[float] = []

    def fire(self, now: float) -> None:
        self.fired.append(now)
        self.due = now + 10.0


def test_no_stream_no_timer_and_the_ticker_stops_with_the_last_one():
    clock = FakeClock(100.0)
    ticker = KeepaliveTicker(clock)
    assert clock.armed == []
    stream: Any = Waiting(110.0)
    ticker.add(stream)
    assert clock.armed == [100.0 + TICK]
    ticker.discard(stream)
    clock.advance_to(100.0 + TICK)
    assert clock.armed == []


def test_a_stream_is_fired_when_due_never_before_and_again_an_interval_later():
    clock = FakeClock(100.0)
    ticker = KeepaliveTicker(clock)
    early: Any = Waiting(110.0)
    late: Any = Waiting(115.5)
    ticker.add(early)
    ticker.add(late)
    clock.advance_to(109.9)
    assert early.fired == late.fired == []
    clock.advance_to(110.0)
    assert early.fired == [110.0]
    clock.advance_to(116.0)
    assert late.fired == [116.0]  # (the first tick at or after 115.5)
    clock.advance_to(120.0)
    assert early.fired == [110.0, 120.0]
    assert len(clock.armed) == 1
