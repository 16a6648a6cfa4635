"""The live-reload supervisor: every trigger goes through one serialized refresh path.

Triggers:

- ``file``: the config file's **directory** is watched (:mod:`iop_edge.config_watch`: inotify
  on Linux, watchfiles elsewhere), so editor saves by rename, ``sed -i``, truncating writes,
  delete + recreate and a Kubernetes ``..data`` symlink swap are all seen; only the names that
  can change what the config path resolves to count (a log file beside it does not), and a
  slow periodic content check backs up missed events. A file whose bytes did not change since
  the last refresh is skipped. A file modified in place is not judged while its writer holds
  it open (inotify's close-write; no timer runs meanwhile), and a changed file is only judged
  once writes have **settled**: its content must stay the same for ``settle`` seconds (read,
  wait, read again, until two reads agree), so a file saved in parts is never loaded
  half-written, even when its first part is a valid config. A file still changing, or still
  open for writing, after ``settle_limit`` seconds is rejected without being loaded. What
  this cannot catch (a second write after a close and a settle window): see
  :mod:`iop_edge.config_watch`.
- ``signal``: SIGHUP (the daemon installs the handler before anything slow).
- ``api``: ``POST /admin/config/refresh`` and ``iop-edge config refresh``; synchronous — the
  caller gets the result of a refresh that started after its call.

Signal and api refreshes do not wait for the file to settle: the operator asked for them. A
SIGHUP that comes while a file change settles (or waits for its writer's close) takes its place
at once.

File and signal triggers that arrive while a refresh runs coalesce into one more run. Each run:
read the file → load → validate → classify against the **running** config (in a worker thread,
under ``deadline``: a large or hostile file can neither stall the event loop nor hold the
refresh path; :mod:`iop_edge.config_file` bounds the read) → apply the live part to the
scheduler and the model catalog in one step of the loop (no request sees half a config) →
record, log, notify. Restart-class changes stay pending until a later file reverts them or the
daemon restarts.

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
from typing import Any, Literal

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
    candidate_snapshot,
    read_secret_file,
    snapshot_config_file,
    variables,
)
from iop_edge.config_watch import ConfigWatch, InotifyUnavailable, WatchStatistics
from iop_edge.errors import ConfigError, ConfigProblem
from iop_edge.logs import Logger
from iop_edge.systemd import Notifier

Trigger = Literal["file", "signal", "api"]


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
#: The pure refresh (:func:`iop_edge.config.refresh.refresh`) as the supervisor calls it.
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


class Supervisor:
    """Owns the running config and the single refresh path.

    ``apply(config)`` must swap the live part in synchronously (scheduler policy and catalog in
    one go) or raise; ``listeners`` hear about every finished refresh (metrics, sd_notify).
    """

    def __init__(
        self,
        path: Path,
        running: EdgeConfig,
        *,
        apply: Callable[[EdgeConfig], None],
        env: Mapping[str, str],
        log: Logger,
        listeners: list[RefreshListener] | None = None,
        options: SupervisorOptions | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.path = path
        self.running = running
        self.running_hash = config_hash(running)
        self.generation = 1
        self.loaded_at = time.time()
        self.restart_pending: list[ReportEntry] = []
        self.last: RefreshRecord | None = None
        self.last_success_at: float | None = self.loaded_at
        self.options = options or SupervisorOptions()
        self._apply = apply
        self._env = env
        self._log = log
        self._listeners = list(listeners or [])
        self._notifier = notifier or Notifier({})
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._signalled = asyncio.Event()
        self._queued: Trigger | None = None
        # Bounded and non-blocking (a FIFO is refused, not read), so safe before the loop runs.
        self._file_digest = snapshot_config_file(str(path)).digest
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()
        self._watcher = ConfigWatch(path, lambda: self.request("file"))
        self._inotify = self.options.inotify
        self.runs = 0
        #: finished reads of the config file (a change, a settle window, a periodic check, a
        #: refresh)
        self.reads = 0
        #: whether the file is watched (``start(watch=...)``; ``reload.watch`` in the config)
        self.watching = False

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, *, watch: bool = True) -> None:
        """Start the worker (and, unless ``watch`` is false, the watcher and the poller)."""
        self._tasks.append(asyncio.create_task(self._worker(), name="refresh-worker"))
        self.watching = watch
        if watch:
            self._tasks.append(asyncio.create_task(self._watch(), name="config-watch"))
            self._tasks.append(asyncio.create_task(self._poll(), name="config-poll"))

    async def stop(self) -> None:
        """Stop the background tasks. Never raises: a task that failed earlier is logged, so
        the daemon's drain goes on."""
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        outcomes = await asyncio.gather(*self._tasks, return_exceptions=True)
        for task, outcome in zip(self._tasks, outcomes, strict=True):
            if isinstance(outcome, Exception):
                self._log_failure("config_task_failed", outcome, task=task.get_name())
        self._tasks.clear()

    def add_listener(self, listener: RefreshListener) -> None:
        """Also call ``listener`` with the record of every refresh that finishes from now on
        (after the ones given at construction, in the order added)."""
        self._listeners.append(listener)

    # -- triggers ----------------------------------------------------------------------------

    def request(self, trigger: Trigger) -> None:
        """Ask for a refresh soon (file events, SIGHUP); requests made while one runs
        coalesce into one more run."""
        # A signal outranks a file event in the record: it was an operator's explicit act.
        if self._queued != "signal":
            self._queued = trigger
        if trigger == "signal":
            self._signalled.set()  # a file trigger still settling gives way to it
        self._wake.set()

    async def refresh(self, trigger: Trigger, mode: str = "apply") -> RefreshResult:
        """Run a refresh now (after any running one) and return its result; never raises."""
        async with self._lock:
            result = await self._run(trigger, mode, force=True)
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
            result = await self._run("api", "dry_run", force=True, snapshot=snapshot, refuse=refuse)
        assert result is not None  # a forced run always runs
        return result

    # -- the path ----------------------------------------------------------------------------

    async def _worker(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            trigger, self._queued = self._queued or "file", None
            try:
                snapshot = None
                if trigger == "file":
                    snapshot = await self._settled()
                    if snapshot is None:
                        continue  # nothing new on disk since the last look
                async with self._lock:
                    await self._run(trigger, "apply", force=trigger != "file", snapshot=snapshot)
            except Exception as exc:  # the worker outlives anything: later saves still count
                self._log_failure("config_refresh_failed", exc, trigger=trigger)

    async def _settled(self) -> ConfigSnapshot | None:
        """The file once its writer closed it and two reads ``settle`` seconds apart agree;
        ``None`` when it holds what was judged last, or when a SIGHUP came meanwhile (its
        refresh, next, reads the file at once: the operator asked for it). A file still
        changing, or still open for writing, after ``settle_limit`` seconds comes back as an
        unreadable snapshot, so it is rejected without being loaded."""
        settle, limit = self.options.settle, self.options.settle_limit
        self._signalled.clear()  # (a SIGHUP before this file trigger was taken ran before it)
        if not await self._writer_closed(0.0):
            return None if self._signalled.is_set() else self._unsettled(self._held_open(limit))
        current = await self._read()
        if current.digest == self._file_digest:
            return None
        waited = 0.0
        while True:
            if not await self._writer_closed(waited):
                return None if self._signalled.is_set() else self._unsettled(self._held_open(limit))
            await self._wait(settle, self._signalled)
            if self._signalled.is_set():
                return None
            waited += settle
            latest = await self._read()
            if latest.digest == current.digest and self._watcher.closed.is_set():
                return latest
            current = latest
            if waited >= limit:
                return self._unsettled(
                    f"{self.path}: the file kept changing for {waited:g} s (it never stayed the "
                    f"same for {settle:g} s), so it was not loaded; it is judged once writes to "
                    "it stop"
                )

    def _held_open(self, limit: float) -> str:
        return (
            f"{self.path}: the file was still open for writing {limit:g} s after it changed "
            "(its writer never closed it), so it was not loaded; it is judged once its writer "
            "closes it"
        )

    def _unsettled(self, message: str) -> ConfigSnapshot:
        return ConfigSnapshot(str(self.path), None, ConfigError([ConfigProblem("", message)]))

    async def _writer_closed(self, waited: float) -> bool:
        """Wait while a writer holds the file open after changing it in place (inotify says
        so; no settle timer runs meanwhile): True once it closed it (at once when none holds
        it); False when one still does at the end of the ``settle_limit`` budget, of which
        ``waited`` seconds went on settling already, or when a SIGHUP came first."""
        closed = self._watcher.closed
        if closed.is_set():
            return True
        remaining = self.options.settle_limit - waited
        if remaining > 0:
            await self._wait(remaining, closed, self._signalled)
        return closed.is_set() and not self._signalled.is_set()

    async def _wait(self, seconds: float, *until: asyncio.Event) -> None:
        """Sleep ``seconds`` (the injected sleep), or less: until one of ``until`` is set."""
        sleep = asyncio.ensure_future(self.options.sleep(seconds))
        waits = [sleep, *(asyncio.ensure_future(event.wait()) for event in until)]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        if sleep.done() and not sleep.cancelled():
            sleep.result()  # a failure of the sleep itself is the worker's to log

    async def _read(self) -> ConfigSnapshot:
        """One read of the config file, in a worker thread, under the deadline; never raises
        (``refresh()`` and the worker call it outside their guards)."""
        try:
            async with asyncio.timeout(self.options.deadline):  # not wait_for: see _judge
                return await asyncio.to_thread(snapshot_config_file, str(self.path))
        except TimeoutError:
            message = (
                f"cannot read config {self.path}: reading it took longer than "
                f"{self.options.deadline:g} s"
            )
        except Exception as exc:  # e.g. no thread to read in: a rejection, not a crash
            self._log_failure("config_read_failed", exc, path=str(self.path))
            message = f"cannot read config {self.path}: {type(exc).__name__}: {exc}"
        finally:
            # Counted once the read is over, in the step its caller resumes in: a test that
            # sees the count knows the caller has acted on it.
            self.reads += 1
        return ConfigSnapshot(str(self.path), None, ConfigError([ConfigProblem("", message)]))

    async def _run(
        self,
        trigger: Trigger,
        mode: str,
        *,
        force: bool,
        snapshot: ConfigSnapshot | None = None,
        refuse: str | None = None,
    ) -> RefreshResult | None:
        """One refresh; ``None`` when not forced and the file's bytes are unchanged."""
        if snapshot is None:
            snapshot = await self._read()
        if not force and snapshot.digest == self._file_digest:
            return None
        if mode == "apply":
            self._file_digest = snapshot.digest
            self._notifier.reloading()
        self.runs += 1
        try:
            result = await self._judge(snapshot, mode, refuse)
        except Exception as exc:  # a bug must not leave RELOADING=1 or kill the caller
            self._log_failure("config_refresh_failed", exc, trigger=trigger)
            reason = (
                f"the refresh failed with an internal error ({type(exc).__name__}: {exc}); "
                "nothing was applied and the running config keeps serving"
            )  # (scrubbed by rejected(), like every message)
            result = self._rejected(mode, reason).result
        record = RefreshRecord(trigger=trigger, at=time.time(), result=result)
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
            try:
                self._apply(outcome.running)
            except Exception as exc:  # an apply failure rejects the whole refresh
                self._log_failure("config_apply_failed", exc)
                return self._rejected(
                    result.mode, f"applying the live changes failed: {exc}"
                ).result
            self.running = outcome.running
            new_hash = config_hash(self.running)
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

    # -- the file ----------------------------------------------------------------------------

    def watch_statistics(self) -> WatchStatistics:
        """The file watch as of now (:mod:`iop_edge.config_watch`)."""
        return self._watcher.statistics()

    async def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                await self._watch_directory()
            except Exception as exc:  # e.g. the directory vanished: keep trying, poll meanwhile
                self._log_failure("config_watch_failed", exc, directory=str(self.path.parent))
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
        await self._watcher.run_watchfiles(debounce=self.options.debounce, stop=self._stop)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.options.poll_interval)
            # A file open for writing is judged when its writer closes it (the close is an
            # event): reading it meanwhile would only find it half-written.
            if not self._watcher.closed.is_set():
                continue
            if (await self._read()).digest != self._file_digest:
                self.request("file")

    # -- status ------------------------------------------------------------------------------

    def __repr__(self) -> str:
        """The live state, for a debugger or a log line (the same words as ``STATUS=``)."""
        return f"<Supervisor {self.path} {status_line(self)}; {self.runs} refresh(es) run>"

    def status(self) -> dict[str, Any]:
        """The config part of ``/admin/status``."""
        return {
            "path": str(self.path),
            "watch": self.watching,
            "hash": self.running_hash,
            "generation": self.generation,
            "loaded_at": self.loaded_at,
            "restart_pending": [
                {"path": e.path, "old": e.old, "new": e.new} for e in self.restart_pending
            ],
            "last_refresh": self.last.to_json() if self.last else None,
            "last_success_at": self.last_success_at,
        }


def status_line(supervisor: Supervisor) -> str:
    """The one-line status for ``systemctl status`` (``STATUS=``)."""
    short = supervisor.running_hash[:12]
    last = supervisor.last
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
    pending = len(supervisor.restart_pending)
    tail = f"; {pending} change(s) need a restart" if pending else ""
    return f"serving config {short} (generation {supervisor.generation}){tail}"


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
