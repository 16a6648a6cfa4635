"""The config file as a source of snapshots: watching it is one job, refreshing from it another.

:class:`FileConfigSource` (the :class:`iop_edge.seams.ConfigSource` of ``serve``) watches the
config file and yields a :class:`~iop_edge.config_file.ConfigSnapshot` each time one is worth a
refresh; :class:`iop_edge.supervisor.Supervisor` takes each (load → classify → apply), as
uvicorn's server takes the changes its reloader yields. The source also reads the file on
demand, for a refresh that the admin API asked for.

- ``file``: the config file's **directory** is watched (:mod:`iop_edge.config_watch`: inotify
  on Linux, watchfiles elsewhere), so editor saves by rename, ``sed -i``, truncating writes,
  delete + recreate and a Kubernetes ``..data`` symlink swap are all seen; only the names that
  can change what the config path resolves to count, and a slow periodic content check backs
  up missed events. A file whose bytes did not change since it was last judged is skipped. A
  file modified in place is not read while its writer holds it open (inotify's close-write; no
  timer runs meanwhile), and a changed file is only yielded once writes have **settled**: its
  content must stay the same for ``settle`` seconds (read, wait, read again, until two reads
  agree), so a file saved in parts is never loaded half-written, even when its first part is a
  valid config. A file still changing, or still open for writing, after ``settle_limit``
  seconds is yielded unread (its snapshot holds why), so it is rejected without being loaded.
- ``signal``: SIGHUP (:meth:`FileConfigSource.request`); its snapshot is the file as it is,
  without settling: the operator asked for it. A SIGHUP that comes while a file change settles
  (or waits for its writer's close) takes its place at once.

Requests that arrive while the refresh path works on a snapshot coalesce into one more look
(a signal outranks a file event: it was an operator's explicit act). Every read is bounded
(:mod:`iop_edge.config_file`) and runs in a worker thread under a deadline, so a hostile file
can neither stall the event loop nor hold the source.

Without a config file — a daemon given its config rather than a file to read it from (embedded
use, tests; ``serve`` always has a file) — the source is a :class:`FixedConfigSource`: it holds
the config it was given, and nothing changes it. What a refresh means then: there is no file
to look at, so the config to judge is the running one itself. Every read yields the running
config's own snapshot (its effective config written out as YAML), so a refresh — SIGHUP, or
one asked for — answers exactly as a refresh of an unchanged file does: ``applied``, no change,
the same hash and generation; it is recorded, logged, counted and told to systemd like any
other. Nothing is watched.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final, Protocol

import yaml

from iop_edge.config import EdgeConfig, dump_config
from iop_edge.config_file import ConfigSnapshot, Trigger, snapshot_config_file
from iop_edge.config_watch import ConfigWatch, InotifyUnavailable, WatchStatistics
from iop_edge.errors import ConfigError, ConfigProblem
from iop_edge.runtime.logs import Logger

__all__ = ["GIVEN_CONFIG", "FailureLog", "FileConfigSource", "FixedConfigSource"]


class FailureLog(Protocol):
    """Logs an unexpected exception under ``event`` with its traceback (the supervisor's, which
    hides the values the running config took from its environment or files)."""

    def __call__(self, event: str, exc: BaseException, **fields: Any) -> None:
        """Log ``exc`` as ``event``, with ``fields``."""
        ...


class FileConfigSource:
    """The config file at ``path``, watched: an async iterator of the snapshots worth a refresh
    (module docstring), and :meth:`read` for a refresh asked for. Timing in seconds; ``sleep``
    is how the settle interval is waited for (tests inject one they release by hand)."""

    def __init__(
        self,
        path: Path,
        *,
        log: Logger,
        failed: FailureLog,
        inotify: bool = True,
        debounce: float = 0.2,
        settle: float = 0.5,
        settle_limit: float = 10.0,
        poll_interval: float = 30.0,
        read_deadline: float = 15.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.path = path
        self._log = log
        self._failed = failed
        self._inotify = inotify
        self._debounce = debounce
        self._settle = settle
        self._settle_limit = settle_limit
        self._poll_interval = poll_interval
        self._read_deadline = read_deadline
        self._sleep = sleep
        self._wake = asyncio.Event()
        self._signalled = asyncio.Event()
        self._queued: Trigger | None = None
        # Bounded and non-blocking (a FIFO is refused, not read), so safe before the loop runs.
        self._judged = snapshot_config_file(str(path)).digest
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()
        self._watcher = ConfigWatch(path, lambda: self.request("file"))
        self._reads = 0
        self._watching = False

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def reads(self) -> int:
        """Finished reads of the config file (a change, a settle window, a periodic check, a
        refresh)."""
        return self._reads

    @property
    def watching(self) -> bool:
        """Whether the file is watched (``start(watch=...)``)."""
        return self._watching

    def start(self, *, watch: bool = True) -> None:
        """Start the watcher and the periodic check, unless ``watch`` is false (then only
        :meth:`request` yields snapshots)."""
        self._watching = watch
        if watch:
            self._tasks.append(asyncio.create_task(self._watch(), name="config-watch"))
            self._tasks.append(asyncio.create_task(self._poll(), name="config-poll"))

    async def stop(self) -> None:
        """Stop the watcher and the periodic check. Never raises: a task that failed earlier
        is logged."""
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        outcomes = await asyncio.gather(*self._tasks, return_exceptions=True)
        for task, outcome in zip(self._tasks, outcomes, strict=True):
            if isinstance(outcome, Exception):
                self._failed("config_task_failed", outcome, task=task.get_name())
        self._tasks.clear()

    def statistics(self) -> WatchStatistics:
        """The file watch as of now (:mod:`iop_edge.config_watch`)."""
        return self._watcher.statistics()

    # -- what the refresh path sees ------------------------------------------------------------

    def request(self, trigger: Trigger) -> None:
        """Ask for a look at the file soon (file events, SIGHUP); requests made while a
        snapshot is being refreshed coalesce into one more look."""
        # A signal outranks a file event in the record: it was an operator's explicit act.
        if self._queued != "signal":
            self._queued = trigger
        if trigger == "signal":
            self._signalled.set()  # a file trigger still settling gives way to it
        self._wake.set()

    def __aiter__(self) -> FileConfigSource:
        """The snapshots worth a refresh, as they come (never ending)."""
        return self

    async def __anext__(self) -> ConfigSnapshot:
        """The next snapshot worth a refresh: a settled change of the file, or the file as it
        is on a SIGHUP. A failure while settling is logged and the watch goes on (later saves
        still count)."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            trigger, self._queued = self._queued or "file", None
            if trigger != "file":
                return await self.read(trigger)
            try:
                snapshot = await self._settled()
            except Exception as exc:  # e.g. the sleep failed: the next change is still seen
                self._failed("config_refresh_failed", exc, trigger=trigger)
                continue
            if snapshot is not None:
                return snapshot

    def judged(self, snapshot: ConfigSnapshot) -> None:
        """The refresh path took ``snapshot`` (to apply it): a file with the same content is
        not yielded again."""
        self._judged = snapshot.digest

    def unchanged(self, snapshot: ConfigSnapshot) -> bool:
        """Whether ``snapshot`` holds the content judged last (a refresh asked for took it
        while this one waited its turn)."""
        return snapshot.digest == self._judged

    async def read(self, trigger: Trigger) -> ConfigSnapshot:
        """One read of the config file, in a worker thread, under the deadline; never raises
        (a failure is an unreadable snapshot, logged)."""
        try:
            async with asyncio.timeout(self._read_deadline):  # not wait_for: see Supervisor
                return await asyncio.to_thread(snapshot_config_file, str(self.path), trigger)
        except TimeoutError:
            message = (
                f"cannot read config {self.path}: reading it took longer than "
                f"{self._read_deadline:g} s"
            )
        except Exception as exc:  # e.g. no thread to read in: a rejection, not a crash
            self._failed("config_read_failed", exc, path=str(self.path))
            message = f"cannot read config {self.path}: {type(exc).__name__}: {exc}"
        finally:
            # Counted once the read is over, in the step its caller resumes in: a test that
            # sees the count knows the caller has acted on it.
            self._reads += 1
        return self._unreadable(message, trigger)

    # -- settling ------------------------------------------------------------------------------

    async def _settled(self) -> ConfigSnapshot | None:
        """The file once its writer closed it and two reads ``settle`` seconds apart agree;
        ``None`` when it holds what was judged last, or when a SIGHUP came meanwhile (its
        snapshot, next, is the file as it is: the operator asked for it). A file still
        changing, or still open for writing, after ``settle_limit`` seconds comes back as an
        unreadable snapshot, so it is rejected without being loaded."""
        settle, limit = self._settle, self._settle_limit
        self._signalled.clear()  # (a SIGHUP before this file trigger was taken ran before it)
        if not await self._writer_closed(0.0):
            return None if self._signalled.is_set() else self._held_open(limit)
        current = await self.read("file")
        if current.digest == self._judged:
            return None
        waited = 0.0
        while True:
            if not await self._writer_closed(waited):
                return None if self._signalled.is_set() else self._held_open(limit)
            await self._wait(settle, self._signalled)
            if self._signalled.is_set():
                return None
            waited += settle
            latest = await self.read("file")
            if latest.digest == current.digest and self._watcher.closed.is_set():
                return latest
            current = latest
            if waited >= limit:
                return self._unreadable(
                    f"{self.path}: the file kept changing for {waited:g} s (it never stayed the "
                    f"same for {settle:g} s), so it was not loaded; it is judged once writes to "
                    "it stop"
                )

    def _held_open(self, limit: float) -> ConfigSnapshot:
        return self._unreadable(
            f"{self.path}: the file was still open for writing {limit:g} s after it changed "
            "(its writer never closed it), so it was not loaded; it is judged once its writer "
            "closes it"
        )

    def _unreadable(self, message: str, trigger: Trigger = "file") -> ConfigSnapshot:
        return ConfigSnapshot(
            str(self.path), None, ConfigError([ConfigProblem("", message)]), trigger
        )

    async def _writer_closed(self, waited: float) -> bool:
        """Wait while a writer holds the file open after changing it in place (inotify says
        so; no settle timer runs meanwhile): True once it closed it (at once when none holds
        it); False when one still does at the end of the ``settle_limit`` budget, of which
        ``waited`` seconds went on settling already, or when a SIGHUP came first."""
        closed = self._watcher.closed
        if closed.is_set():
            return True
        remaining = self._settle_limit - waited
        if remaining > 0:
            await self._wait(remaining, closed, self._signalled)
        return closed.is_set() and not self._signalled.is_set()

    async def _wait(self, seconds: float, *until: asyncio.Event) -> None:
        """Sleep ``seconds`` (the injected sleep), or less: until one of ``until`` is set."""
        sleep = asyncio.ensure_future(self._sleep(seconds))
        waits = [sleep, *(asyncio.ensure_future(event.wait()) for event in until)]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        if sleep.done() and not sleep.cancelled():
            sleep.result()  # a failure of the sleep itself is logged by __anext__

    # -- watching ------------------------------------------------------------------------------

    async def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                await self._watch_directory()
            except Exception as exc:  # e.g. the directory vanished: keep trying, poll meanwhile
                self._failed("config_watch_failed", exc, directory=str(self.path.parent))
                await asyncio.sleep(1.0)

    async def _watch_directory(self) -> None:
        """Watch until stopped, or (inotify) until the directory itself went away: then the
        file is looked at and the caller watches again."""
        if self._inotify:
            try:
                await self._watcher.run_inotify()
            except InotifyUnavailable as exc:
                self._inotify = False
                self._log.info(
                    "config_watch_fallback",
                    reason=str(exc),
                    message="the config file is watched with watchfiles: a file written in "
                    "place is judged by the settle window alone (no close-write)",
                )
            else:
                self.request("file")  # the directory was deleted or moved
                return
        await self._watcher.run_watchfiles(debounce=self._debounce, stop=self._stop)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._poll_interval)
            # A file open for writing is judged when its writer closes it (the close is an
            # event): reading it meanwhile would only find it half-written.
            if not self._watcher.closed.is_set():
                continue
            if (await self.read("file")).digest != self._judged:
                self.request("file")


GIVEN_CONFIG: Final = "the config given (no file)"
"""How the snapshots of a :class:`FixedConfigSource` name where they come from (in place of a
file's path: a message about one would quote it)."""

#: PyYAML's C dumper where it is built (the config's dump runs once, at the start).
_Dumper: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def _literal(value: Any) -> Any:
    """``value`` with every ``$`` of its strings written ``$$``: the loader expands ``${VAR}``
    in string values, and the running config's values are already expanded (a ``$`` in one is
    a ``$``, and must load back as one)."""
    if isinstance(value, str):
        return value.replace("$", "$$")
    if isinstance(value, dict):
        return {key: _literal(item) for key, item in value.items()}  # keys are not expanded
    if isinstance(value, list):
        return [_literal(item) for item in value]
    return value


def _running_config_text(config: EdgeConfig) -> bytes:
    """``config`` as the YAML of a file holding it: loaded (with any environment), it is
    ``config`` again — the same values, the same :func:`~iop_edge.config.refresh.config_hash`."""
    text = yaml.dump(_literal(dump_config(config)), Dumper=_Dumper, sort_keys=False)
    return str(text).encode("utf-8")


class FixedConfigSource:
    """The config a daemon was given instead of a file (module docstring): no watch, and every
    read yields the same snapshot — the running config's own — so a refresh finds it unchanged.

    A :class:`~iop_edge.seams.ConfigSource`; :attr:`path` is ``None``: there is no file.
    """

    def __init__(self, config: EdgeConfig) -> None:
        # Written out once, now: the config never changes, and a refresh should not pay for it.
        self._data = _running_config_text(config)
        self._judged = ConfigSnapshot(GIVEN_CONFIG, self._data, None).digest
        self._wake = asyncio.Event()
        self._queued: Trigger | None = None
        self._reads = 0

    @property
    def path(self) -> None:
        """``None``: the config was given, not read from a file."""
        return None

    @property
    def reads(self) -> int:
        """Snapshots yielded so far (there is nothing to read: each is the config held)."""
        return self._reads

    @property
    def watching(self) -> bool:
        """Always false: there is no file to watch."""
        return False

    def start(self, *, watch: bool = True) -> None:
        """Nothing to start (``watch`` is moot without a file): only :meth:`request` yields
        snapshots."""

    async def stop(self) -> None:
        """Nothing to stop."""

    def statistics(self) -> WatchStatistics:
        """A watch that never started (no backend, no names, no events)."""
        return WatchStatistics("", (), 0, 0, ())

    def request(self, trigger: Trigger) -> None:
        """Ask for the snapshot soon (a SIGHUP); requests made while one is being refreshed
        coalesce into one more (a signal outranks a file event, as for a file)."""
        if self._queued != "signal":
            self._queued = trigger
        self._wake.set()

    def __aiter__(self) -> FixedConfigSource:
        """The snapshots asked for with :meth:`request`, as they come (never ending)."""
        return self

    async def __anext__(self) -> ConfigSnapshot:
        """The next snapshot asked for: the config held, under the trigger that asked."""
        await self._wake.wait()
        self._wake.clear()
        trigger, self._queued = self._queued or "signal", None
        return await self.read(trigger)

    async def read(self, trigger: Trigger) -> ConfigSnapshot:
        """The config held, as a snapshot made for ``trigger``; never raises."""
        self._reads += 1
        return ConfigSnapshot(GIVEN_CONFIG, self._data, None, trigger)

    def judged(self, snapshot: ConfigSnapshot) -> None:
        """The refresh path took ``snapshot`` (always the config held)."""
        self._judged = snapshot.digest

    def unchanged(self, snapshot: ConfigSnapshot) -> bool:
        """Whether ``snapshot`` holds the content taken last (the config held always does)."""
        return snapshot.digest == self._judged
