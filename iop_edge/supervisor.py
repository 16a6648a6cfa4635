"""The live-reload supervisor: every refresh goes through one serialized path.

The supervisor reads a :class:`~iop_edge.seams.ConfigSource` (``serve``'s is
:class:`iop_edge.config_source.FileConfigSource`: the config file watched, settled, SIGHUP),
which yields a :class:`~iop_edge.config_file.ConfigSnapshot` each time one is worth a refresh;
watching is the source's job, refreshing this module's. A daemon given its config without a
file has a supervisor too: its source, :class:`iop_edge.config_source.FixedConfigSource`,
holds that config, and a refresh finds it unchanged (see that module). Triggers:

- ``file`` and ``signal``: the snapshots the source yields (see :mod:`iop_edge.config_source`
  for when: a change once settled, a SIGHUP at once).
- ``api``: ``POST /admin/config/refresh`` and ``iop-edge config refresh``; synchronous — the
  caller gets the result of a refresh that started after its call (the source reads the file
  for it then).

Snapshots that come while a refresh runs wait their turn; triggers that arrive meanwhile
coalesce into one more (the source's). Each run: load → validate → classify the snapshot
against the **running** config (in a worker thread, under ``deadline``: a large or hostile
file can neither stall the event loop nor hold the refresh path; :mod:`iop_edge.config_file`
bounds the read) → apply the live part to the scheduler and the model catalog in one step of
the loop (no request sees half a config) → record, log, notify. The config's hash is computed
once per run, by the classification, and carried in its result. Restart-class changes stay
pending until a later file reverts them or the daemon restarts.

Nothing a refresh raises escapes: it becomes a ``rejected`` result whose reason is logged with
its traceback, counted and shown in ``STATUS=``; the refresh worker outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iop_edge.config.refresh import (
    RefreshOutcome,
    RefreshResult,
    ReportEntry,
    config_hash,
    refresh,
    rejected,
)
from iop_edge.config.schema import EdgeConfig
from iop_edge.config_file import (
    LOAD_DEADLINE,
    ConfigSnapshot,
    Trigger,
    candidate_snapshot,
    read_secret_file,
    variables,
)
from iop_edge.config_source import FileConfigSource, FixedConfigSource
from iop_edge.config_watch import WatchStatistics
from iop_edge.errors import ConfigError, ConfigProblem
from iop_edge.runtime.logs import Logger
from iop_edge.runtime.systemd import Notifier
from iop_edge.seams import ConfigSource

__all__ = [
    "RefreshRecord",
    "Supervisor",
    "SupervisorOptions",
    "SupervisorStatistics",
    "Trigger",
    "status_line",
]


@dataclass(frozen=True, slots=True)
class RefreshRecord:
    """One finished refresh: what triggered it, when (Unix time), and its result."""

    trigger: str
    at: float
    result: RefreshResult

    def to_json(self) -> dict[str, Any]:
        """The JSON form used by ``/admin/status``."""
        return {"trigger": self.trigger, "at": self.at, **self.result.to_json()}


RefreshListener = Callable[[RefreshRecord], None]
#: The pure refresh (:func:`iop_edge.config.refresh.refresh`) as the supervisor calls it; the
#: result it returns carries the hash of the config to run after it (``config_hash``).
Classifier = Callable[..., RefreshOutcome]


@dataclass
class SupervisorOptions:
    """Timing of the file watcher and of each refresh (seconds), and the seams tests drive.

    ``settle`` is 0.5 s: every writer we know of (editors, ``sed -i``, ``cp``, configuration
    management, a ConfigMap swap) writes a config in milliseconds, so half a second of quiet
    after its close (or its rename) means the write is over, and a save takes effect about
    0.5 s after it (0.7 s with watchfiles: its debounce + settle).
    """

    #: Watch with inotify where there is one (:mod:`iop_edge.config_watch`); false: with
    #: watchfiles, as where there is none.
    inotify: bool = True
    #: Events are grouped this long (watchfiles only: inotify needs no grouping).
    debounce: float = 0.2
    settle: float = 0.5
    #: A file that keeps changing (or stays open for writing) this long is rejected without
    #: being loaded.
    settle_limit: float = 10.0
    poll_interval: float = 30.0
    #: One read + load + classify may take this long; then the refresh is rejected.
    deadline: float = LOAD_DEADLINE
    #: How the settle interval is waited for (tests inject one they release by hand).
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    #: The pure refresh, run in a worker thread (tests inject a failing or blocking one).
    classify: Classifier = refresh


@dataclass(frozen=True, slots=True)
class SupervisorStatistics:
    """A snapshot of the supervisor: the running config and its last refresh (read at scrape
    time by the metrics, rendered by ``/admin/status`` and ``STATUS=``)."""

    path: str | None
    """The config file (``None``: the config was given without one)."""
    watching: bool
    """Whether the file is watched (``start(watch=...)``; ``reload.watch`` in the config)."""
    running_hash: str
    """The hash of the running config (:func:`~iop_edge.config.refresh.config_hash`)."""
    generation: int
    """1 at the start, one more for each refresh that changed the running config."""
    loaded_at: float
    """Unix time the process loaded its config."""
    restart_pending: tuple[ReportEntry, ...]
    """The changes of the last refresh that wait for a restart."""
    last: RefreshRecord | None
    """The last refresh that was applied or rejected (None: none yet)."""
    last_success_at: float | None
    """Unix time of the last refresh that was not rejected (or of the start)."""
    runs: int
    """Refreshes run (applied, rejected and dry runs)."""
    reads: int
    """Finished reads of the config file (a change, a settle window, a periodic check, a
    refresh)."""

    def as_status(self) -> dict[str, Any]:
        """The config part of ``/admin/status``."""
        return {
            "path": self.path,
            "watch": self.watching,
            "hash": self.running_hash,
            "generation": self.generation,
            "loaded_at": self.loaded_at,
            "restart_pending": [
                {"path": e.path, "old": e.old, "new": e.new}
                | ({"reason": e.reason} if e.reason else {})
                for e in self.restart_pending
            ],
            "last_refresh": self.last.to_json() if self.last else None,
            "last_success_at": self.last_success_at,
        }

    def status_line(self) -> str:
        """The one-line status for ``systemctl status`` (``STATUS=``)."""
        short = self.running_hash[:12]
        last = self.last
        if last is not None and last.result.result == "rejected":
            first = last.result.errors[0] if last.result.errors else None
            reason = (
                f"{first.path}: {first.message}"
                if first and first.path
                else first.message
                if first
                else "rejected"
            )
            return f"config {short}; last reload rejected: {reason[:200]}"
        pending = len(self.restart_pending)
        tail = f"; {pending} change(s) need a restart" if pending else ""
        return f"serving config {short} (generation {self.generation}){tail}"


class Supervisor:
    """Owns the running config and the single refresh path.

    ``apply(config)`` must swap the live part in synchronously (scheduler policy and catalog in
    one go) or raise; ``listeners`` hear about every finished refresh (metrics, sd_notify).
    ``source`` yields what to refresh, and owns the path of the file it reads; by default the
    file at ``path``, watched with the timing of ``options`` — or, when ``path`` is ``None``
    (no file), ``running`` itself, fixed (:class:`~iop_edge.config_source.FixedConfigSource`).
    """

    def __init__(
        self,
        path: Path | None,
        running: EdgeConfig,
        *,
        apply: Callable[[EdgeConfig], None],
        env: Mapping[str, str],
        log: Logger,
        listeners: list[RefreshListener] | None = None,
        options: SupervisorOptions | None = None,
        notifier: Notifier | None = None,
        source: ConfigSource | None = None,
    ) -> None:
        self.running = running
        self.running_hash = config_hash(running)
        self.generation = 1
        self.loaded_at = time.time()
        self.restart_pending: list[ReportEntry] = []
        self.last: RefreshRecord | None = None
        self.last_success_at: float | None = self.loaded_at
        self.options = options = options or SupervisorOptions()
        self._apply = apply
        self._env = env
        self._log = log
        self._listeners = list(listeners or [])
        self._notifier = notifier or Notifier({})
        self._lock = asyncio.Lock()
        if source is None:
            source = (
                FixedConfigSource(running)
                if path is None
                else FileConfigSource(
                    path,
                    log=log,
                    failed=self._log_failure,
                    inotify=options.inotify,
                    debounce=options.debounce,
                    settle=options.settle,
                    settle_limit=options.settle_limit,
                    poll_interval=options.poll_interval,
                    read_deadline=options.deadline,
                    sleep=options.sleep,
                )
            )
        self._source: ConfigSource = source
        self._worker_task: asyncio.Task[None] | None = None
        self.runs = 0

    @property
    def reads(self) -> int:
        """Finished reads of the config file (a change, a settle window, a periodic check, a
        refresh)."""
        return self._source.reads

    @property
    def watching(self) -> bool:
        """Whether the file is watched (``start(watch=...)``; ``reload.watch`` in the config)."""
        return self._source.watching

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, *, watch: bool = True) -> None:
        """Start the worker (and, unless ``watch`` is false, the source's watch)."""
        self._worker_task = asyncio.create_task(self._worker(), name="refresh-worker")
        self._source.start(watch=watch)

    async def stop(self) -> None:
        """Stop the worker and the watch. Never raises: a task that failed earlier is logged,
        so the daemon's drain goes on."""
        worker, self._worker_task = self._worker_task, None
        if worker is not None:
            worker.cancel()
            [outcome] = await asyncio.gather(worker, return_exceptions=True)
            if isinstance(outcome, Exception):
                self._log_failure("config_task_failed", outcome, task=worker.get_name())
        await self._source.stop()

    def add_listener(self, listener: RefreshListener) -> None:
        """Also call ``listener`` with the record of every refresh that finishes from now on
        (after the ones given at construction, in the order added)."""
        self._listeners.append(listener)

    # -- triggers ----------------------------------------------------------------------------

    def request(self, trigger: Trigger) -> None:
        """Ask for a refresh soon (file events, SIGHUP): the source's; requests made while one
        runs coalesce into one more run."""
        self._source.request(trigger)

    async def refresh(self, trigger: Trigger, mode: str = "apply") -> RefreshResult:
        """Run a refresh now (after any running one) and return its result; never raises."""
        async with self._lock:
            snapshot = await self._source.read(trigger)
            result = await self._run(snapshot, mode, force=True)
        assert result is not None  # a forced run always runs
        return result

    async def judge(self, data: bytes, source: str, *, refuse: str | None = None) -> RefreshResult:
        """Dry-run the candidate ``data`` (a config file's bytes, named ``source`` in its
        errors) against the running config, as a refresh of the file would judge it: same
        limits, same deadline, ``${VAR}`` and ``${file:}`` resolved as for the daemon's own
        file — unless ``refuse`` says why not: then every reference is a problem, and neither
        the environment nor any file is read. No value the daemon took from its environment
        or a file is in the result (:mod:`iop_edge.config.provenance`). Nothing is applied,
        recorded or notified, and the config file is neither read nor remembered as judged;
        never raises."""
        snapshot = candidate_snapshot(source, data)
        async with self._lock:
            result = await self._run(snapshot, "dry_run", force=True, refuse=refuse)
        assert result is not None  # a forced run always runs
        return result

    # -- the path ----------------------------------------------------------------------------

    async def _worker(self) -> None:
        async for snapshot in self._source:
            try:
                async with self._lock:
                    await self._run(snapshot, "apply", force=snapshot.trigger != "file")
            except Exception as exc:  # the worker outlives anything: later saves still count
                self._log_failure("config_refresh_failed", exc, trigger=snapshot.trigger)

    async def _run(
        self,
        snapshot: ConfigSnapshot,
        mode: str,
        *,
        force: bool,
        refuse: str | None = None,
    ) -> RefreshResult | None:
        """One refresh of ``snapshot``; ``None`` when not forced and its content is what was
        taken last (a refresh asked for took it while this one waited)."""
        if not force and self._source.unchanged(snapshot):
            return None
        if mode == "apply":
            self._source.judged(snapshot)
            self._notifier.reloading()
        self.runs += 1
        try:
            result = await self._judge(snapshot, mode, refuse)
        except Exception as exc:  # a bug must not leave RELOADING=1 or kill the caller
            self._log_failure("config_refresh_failed", exc, trigger=snapshot.trigger)
            reason = (
                f"the refresh failed with an internal error ({type(exc).__name__}: {exc}); "
                "nothing was applied and the running config keeps serving"
            )  # (scrubbed by rejected(), like every message)
            result = self._rejected(mode, reason).result
        record = RefreshRecord(trigger=snapshot.trigger, at=time.time(), result=result)
        if mode == "apply":
            self._record(record)
            self._notifier.ready(status_line(self))
        return result

    async def _judge(
        self, snapshot: ConfigSnapshot, mode: str, refuse: str | None = None
    ) -> RefreshResult:
        """Load and classify ``snapshot`` in a worker thread under the deadline; apply it."""
        running, running_hash = self.running, self.running_hash

        def classify() -> RefreshOutcome:
            try:
                text = snapshot.text()
                env = {} if refuse is not None else variables(self._env)  # reads --env-file
            except ConfigError as exc:
                return rejected(running, mode, exc.problems, running_hash)
            return self.options.classify(
                running,
                text,
                mode=mode,
                env=env,
                read_file=None if refuse is not None else read_secret_file,
                refuse=refuse,
                source=snapshot.path,
                running_hash=running_hash,  # known: not hashed again
            )

        try:
            # Not asyncio.wait_for: on Python 3.11 it swallows a cancellation that arrives in
            # the loop step in which the thread's result does, and the worker would outlive
            # stop() (the drain waited for its cut).
            async with asyncio.timeout(self.options.deadline):
                outcome = await in_daemon_thread(classify)
        except TimeoutError:
            return self._rejected(
                mode,
                f"{snapshot.path}: loading the config took longer than "
                f"{self.options.deadline:g} s, so it was not applied; the running config keeps "
                "serving",
            ).result
        if mode == "apply" and outcome.result.result != "rejected":
            return self._take(outcome)
        return outcome.result

    def _take(self, outcome: RefreshOutcome) -> RefreshResult:
        """Swap in the live part (in this loop step) and update what is pending."""
        result = outcome.result
        if outcome.running is not self.running:
            # The classification hashed the config it returns: the hash is taken, not computed
            # again (before anything is applied, so a classifier without one applies nothing).
            new_hash = result.config_hash
            if new_hash is None:
                raise ValueError("the classification gave no config_hash for its config")
            try:
                self._apply(outcome.running)
            except Exception as exc:  # an apply failure rejects the whole refresh
                self._log_failure("config_apply_failed", exc)
                return self._rejected(
                    result.mode, f"applying the live changes failed: {exc}"
                ).result
            self.running = outcome.running
            if new_hash != self.running_hash:
                self.running_hash = new_hash
                self.generation += 1
        self.restart_pending = [e for e in result.report if e.change_class == "restart"]
        return result

    def _record(self, record: RefreshRecord) -> None:
        self.last = record
        result = record.result
        if result.result != "rejected":
            self.last_success_at = record.at
        # A rejected reload is a warning: the file on disk is not what runs. Each change is
        # logged with its old and new values, redacted as in the refresh result.
        log = self._log.warning if result.result == "rejected" else self._log.info
        log(
            "config_refresh",
            trigger=record.trigger,
            result=result.result,
            hash=self.running_hash,
            generation=self.generation,
            changes=[
                {
                    "path": e.path,
                    "class": e.change_class,
                    "old": e.old,
                    "new": e.new,
                    "applied": e.applied,
                }
                | ({"reason": e.reason} if e.reason else {})
                for e in result.report
            ],
            errors=[f"{e.path}: {e.message}" if e.path else e.message for e in result.errors],
            restart_pending=[e.path for e in self.restart_pending],
        )
        for listener in self._listeners:
            try:
                listener(record)
            except Exception as exc:  # one broken listener must not stop the others
                self._log_failure("config_listener_failed", exc)

    def _rejected(self, mode: str, message: str) -> RefreshOutcome:
        return rejected(self.running, mode, [ConfigProblem("", message)], self.running_hash)

    def _log_failure(self, event: str, exc: BaseException, **fields: Any) -> None:
        """Log an unexpected exception with its traceback (as text: one JSON line), without
        the values the running config took from its environment or files."""
        scrub = self.running.provenance.scrub_text
        self._log.error(
            event,
            error=scrub(f"{type(exc).__name__}: {exc}"),
            exception=scrub("".join(traceback.format_exception(exc))),
            **fields,
        )

    # -- views -------------------------------------------------------------------------------

    def watch_statistics(self) -> WatchStatistics:
        """The file watch as of now (:mod:`iop_edge.config_watch`)."""
        return self._source.statistics()

    def statistics(self) -> SupervisorStatistics:
        """The supervisor as of now (the running config, its last refresh, the counts)."""
        path = self._source.path
        return SupervisorStatistics(
            path=None if path is None else str(path),
            watching=self._source.watching,
            running_hash=self.running_hash,
            generation=self.generation,
            loaded_at=self.loaded_at,
            restart_pending=tuple(self.restart_pending),
            last=self.last,
            last_success_at=self.last_success_at,
            runs=self.runs,
            reads=self._source.reads,
        )

    def __repr__(self) -> str:
        """The live state, for a debugger or a log line (the same words as ``STATUS=``)."""
        path = self._source.path
        where = "without a config file" if path is None else str(path)
        return f"<Supervisor {where} {status_line(self)}; {self.runs} refresh(es) run>"


def status_line(supervisor: Supervisor) -> str:
    """The one-line status for ``systemctl status`` (``STATUS=``)."""
    return supervisor.statistics().status_line()


async def in_daemon_thread(work: Callable[[], RefreshOutcome]) -> RefreshOutcome:
    """Run ``work`` in a thread of its own and await its result.

    Unlike the loop's default executor, a daemon thread that outlives its caller (a load past
    the deadline, abandoned) holds neither the loop's shutdown nor the process's exit: SIGTERM
    still ends the daemon within its drain timeout. A result that arrives after the caller gave
    up, or after the loop closed, is dropped.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[RefreshOutcome] = loop.create_future()

    def settle(outcome: RefreshOutcome | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        elif outcome is not None:
            future.set_result(outcome)

    def run() -> None:
        try:
            outcome, error = work(), None
        except BaseException as exc:  # handed to the caller, like to_thread
            outcome, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, outcome, error)

    threading.Thread(target=run, name="config-load", daemon=True).start()
    return await future
