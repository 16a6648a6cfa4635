"""A config source a test feeds by hand (:class:`HandSource`), for the supervisor's tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from iop_edge.config_file import ConfigSnapshot, Trigger
from iop_edge.config_watch import WatchStatistics


class HandSource:
    """A :class:`~iop_edge.seams.ConfigSource` the test feeds: :meth:`push` yields a
    snapshot; :meth:`read` answers with :attr:`content` (as the file would hold it)."""

    def __init__(self, path: Path, content: str) -> None:
        self.path = path
        self.content = content
        self.pushed: asyncio.Queue[ConfigSnapshot] = asyncio.Queue()
        self.taken: list[ConfigSnapshot] = []
        self.requested: list[Trigger] = []
        self.started: bool | None = None
        self.stopped = False
        self._reads = 0

    @property
    def reads(self) -> int:
        return self._reads

    @property
    def watching(self) -> bool:
        return bool(self.started)

    def start(self, *, watch: bool = True) -> None:
        self.started = watch

    async def stop(self) -> None:
        self.stopped = True

    def statistics(self) -> WatchStatistics:
        return WatchStatistics("hand", (self.path.name,), 0, 0, ())

    def request(self, trigger: Trigger) -> None:
        self.requested.append(trigger)

    def snapshot(self, content: str, trigger: Trigger) -> ConfigSnapshot:
        return ConfigSnapshot(str(self.path), content.encode(), None, trigger)

    def push(self, content: str, trigger: Trigger) -> None:
        self.pushed.put_nowait(self.snapshot(content, trigger))

    async def _snapshots(self) -> AsyncIterator[ConfigSnapshot]:
        while True:
            yield await self.pushed.get()

    def __aiter__(self) -> AsyncIterator[ConfigSnapshot]:
        return self._snapshots()

    async def read(self, trigger: Trigger) -> ConfigSnapshot:
        self._reads += 1
        return self.snapshot(self.content, trigger)

    def judged(self, snapshot: ConfigSnapshot) -> None:
        self.taken.append(snapshot)

    def unchanged(self, snapshot: ConfigSnapshot) -> bool:
        return bool(self.taken) and self.taken[-1].digest == snapshot.digest
