"""Per-principal request rates (SPEC §5.2 ``max_requests_per_minute``), as token buckets on the
scheduler's clock: pure, times passed in, per edge process and in memory.

Each limited principal has a bucket of ``per_minute`` tokens that refills at ``per_minute / 60``
tokens a second; a request takes one. So a principal may send its minute's worth at once, and
then one request every ``60 / per_minute`` seconds. A refused request takes nothing and is told
how long until one token is back (its ``Retry-After``).
"""

from __future__ import annotations

from collections.abc import Mapping


class RateLimits:
    """The token buckets of the principals that have a ``max_requests_per_minute``."""

    __slots__ = ("_buckets", "_limits")

    def __init__(self, per_minute: Mapping[str, int] | None = None) -> None:
        self._limits: dict[str, int] = {}
        #: principal -> (tokens, when they were counted)
        self._buckets: dict[str, tuple[float, float]] = {}
        self.update(per_minute or {})

    def update(self, per_minute: Mapping[str, int]) -> None:
        """Take new limits live: a principal keeps the tokens it has (no more than its new
        limit); one newly limited starts with a full bucket; one no longer limited is forgotten."""
        for principal, limit in per_minute.items():
            if limit < 1:
                raise ValueError(f"max_requests_per_minute of {principal!r} is {limit}, below 1")
        self._limits = dict(per_minute)
        self._buckets = {
            p: (min(tokens, self._limits[p]), at)
            for p, (tokens, at) in self._buckets.items()
            if p in self._limits
        }

    def take(self, principal: str, now: float) -> float | None:
        """Take one token for a request of ``principal`` at ``now``: ``None`` when it may go,
        else the seconds until it could (nothing is taken)."""
        limit = self._limits.get(principal)
        if limit is None:
            return None
        rate = limit / 60.0
        tokens, at = self._buckets.get(principal, (float(limit), now))
        tokens = min(float(limit), tokens + (now - at) * rate)
        if tokens >= 1.0:
            self._buckets[principal] = (tokens - 1.0, now)
            return None
        self._buckets[principal] = (tokens, now)
        return (1.0 - tokens) / rate
