"""The redial backoff of ``iop-node`` (design §2, "Reconnect"): full jitter, 0.5 s doubling,
capped at 30 s, back to 0.5 s after a reset."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from iop_edge.node.backoff import BASE_DELAY, MAX_DELAY, Backoff


def test_the_bounds_double_from_half_a_second_up_to_thirty():
    backoff = Backoff(random=lambda: 1.0)  # the top of each window: the bound itself
    delays = [backoff.next_delay() for _ in range(9)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert (BASE_DELAY, MAX_DELAY) == (0.5, 30.0)


def test_each_delay_is_the_random_fraction_of_its_bound():
    draws = iter([0.0, 0.25, 0.5])
    backoff = Backoff(random=lambda: next(draws))
    assert [backoff.next_delay() for _ in range(3)] == [0.0, 0.25, 1.0]
    assert backoff.attempts == 3


def test_reset_starts_again_from_the_base():
    backoff = Backoff(random=lambda: 1.0)
    for _ in range(5):
        backoff.next_delay()
    assert backoff.bound() == 16.0
    backoff.reset()
    assert backoff.attempts == 0
    assert backoff.next_delay() == 0.5


def test_a_long_outage_stays_at_the_cap():
    backoff = Backoff(random=lambda: 1.0)
    for _ in range(10_000):
        backoff.next_delay()
    assert backoff.next_delay() == 30.0


@given(st.lists(st.floats(min_value=0.0, max_value=1.0, exclude_max=True), max_size=80))
def test_every_delay_is_within_zero_and_its_bound(draws: list[float]) -> None:
    source = iter(draws)
    backoff = Backoff(random=lambda: next(source))
    for n, _ in enumerate(draws):
        delay = backoff.next_delay()
        assert 0.0 <= delay <= min(30.0, 0.5 * 2**n)


@pytest.mark.parametrize(("base", "cap"), [(0.0, 30.0), (-1.0, 30.0), (31.0, 30.0)])
def test_a_base_that_is_not_positive_or_above_the_cap_is_refused(base: float, cap: float) -> None:
    with pytest.raises(ValueError, match=rf"base {base} s and cap {cap} s"):
        Backoff(base, cap)
