"""How long ``iop-node`` waits before it dials the edge again: full-jitter exponential backoff.

Pure (no clock, no I/O, no global random state): :class:`Backoff` is handed its random source,
so tests assert exact delays. The n-th delay since the last :meth:`Backoff.reset` is drawn
uniformly from ``[0, min(cap, base × 2ⁿ)]`` ("full jitter"): nodes cut off by one edge restart
spread their redials over the whole window instead of all dialling at the same instants.
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable
from typing import Final

__all__ = ["BASE_DELAY", "MAX_DELAY", "Backoff"]

BASE_DELAY: Final = 0.5
"""Seconds: the bound of the first delay after a reset."""

MAX_DELAY: Final = 30.0
"""Seconds: no delay is ever longer (the issue's cap)."""


class Backoff:
    """Full-jitter exponential backoff: delays bounded by ``base``, then twice that, and so on,
    never above ``cap``; each one uniform in ``[0, bound]`` by ``random`` (a function returning
    a float in ``[0, 1)``, like :func:`random.random`)."""

    __slots__ = ("_attempts", "_base", "_cap", "_random")

    def __init__(
        self,
        base: float = BASE_DELAY,
        cap: float = MAX_DELAY,
        random: Callable[[], float] = _random.random,
    ) -> None:
        if not 0 < base <= cap:
            raise ValueError(
                f"backoff base {base} s and cap {cap} s: the base must be positive "
                "and not above the cap"
            )
        self._base = base
        self._cap = cap
        self._random = random
        self._attempts = 0

    @property
    def attempts(self) -> int:
        """Delays handed out since the last :meth:`reset`."""
        return self._attempts

    def bound(self) -> float:
        """The upper bound of the next delay: ``min(cap, base × 2^attempts)``."""
        # Past 2**64 the product only overflows towards the cap; stop doubling long before.
        exponent = min(self._attempts, 64)
        return min(self._cap, self._base * 2.0**exponent)

    def next_delay(self) -> float:
        """The seconds to wait before the next dial; each call doubles the next bound."""
        delay = self.bound() * self._random()
        self._attempts += 1
        return delay

    def reset(self) -> None:
        """A link was acknowledged and stayed up: the next delay is bounded by ``base`` again."""
        self._attempts = 0
