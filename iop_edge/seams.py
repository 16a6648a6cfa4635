"""The seams of iop-edge as ``typing.Protocol`` types, in one place.

The pure core never reads the clock; the shell reads one injected :class:`Clock`, so tests can
drive time by hand (see :class:`iop_edge.testing.clock.FakeClock`). The scheduler's health
checks run through a :data:`Prober` the daemon builds from the adapters. The supervisor
refreshes from a :class:`ConfigSource` (``serve``'s watches the config file:
:class:`iop_edge.config_source.FileConfigSource`; a daemon given its config without a file
holds it fixed: :class:`iop_edge.config_source.FixedConfigSource`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pathlib import Path

    from iop_edge.config_file import ConfigSnapshot, Trigger
    from iop_edge.config_watch import WatchStatistics

ProbeResult = tuple[bool, str | None]
"""A health check's verdict: whether the provider answered as healthy, and if not, why."""

Prober = Callable[[tuple[str, str]], Awaitable[ProbeResult]]
"""Runs the health check of provider ``(node_id, provider_id)``."""


class Clock(Protocol):
    """A monotonic clock in seconds; the asyncio glue arms its timers against it."""

    def now(self) -> float:
        """Return the current monotonic time in seconds."""
        ...

    def call_at(self, when: float, callback: Callable[[], None]) -> Callable[[], None]:
        """Run ``callback`` from the event loop once ``now() >= when``; return its canceller.

        Calling the returned function cancels the timer if it has not fired (later calls and
        calls after it fired do nothing). A callback may run a little late, never early.
        """
        ...


class ConfigSource(Protocol):
    """Where the supervisor's config comes from: the snapshots worth a refresh as they come (a
    change of the file once settled, a SIGHUP), and a read on demand (a refresh the admin API
    asked for). Watching is the source's job; refreshing (load → classify → apply) the
    supervisor's, which tells the source what it took."""

    @property
    def path(self) -> Path | None:
        """The config file; ``None`` when the config was given without one."""
        ...

    @property
    def reads(self) -> int:
        """Finished reads of the config so far."""
        ...

    @property
    def watching(self) -> bool:
        """Whether changes are watched for (else only :meth:`request` yields snapshots)."""
        ...

    def start(self, *, watch: bool = True) -> None:
        """Start watching (unless ``watch`` is false); needs the running loop."""
        ...

    async def stop(self) -> None:
        """Stop watching; never raises."""
        ...

    def statistics(self) -> WatchStatistics:
        """The watch as of now."""
        ...

    def request(self, trigger: Trigger) -> None:
        """Ask for a snapshot soon (a file event, SIGHUP); requests coalesce."""
        ...

    def __aiter__(self) -> AsyncIterator[ConfigSnapshot]:
        """The snapshots worth a refresh, as they come."""
        ...

    async def read(self, trigger: Trigger) -> ConfigSnapshot:
        """The config as it is now; never raises (a failure is an unreadable snapshot)."""
        ...

    def judged(self, snapshot: ConfigSnapshot) -> None:
        """The refresh path took ``snapshot`` to apply it: the same content is not yielded
        again."""
        ...

    def unchanged(self, snapshot: ConfigSnapshot) -> bool:
        """Whether ``snapshot`` holds the content the refresh path took last."""
        ...
