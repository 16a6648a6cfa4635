"""The live-reload supervisor: every trigger goes through one serialized refresh path.

Triggers:

- ``file``: the config file's **directory** is watched (watchfiles), so editor saves by rename,
  ``sed -i``, truncating writes, delete + recreate and a Kubernetes ``..data`` symlink swap are
  all seen; events are debounced, and a slow periodic content check backs up missed events.
  A file whose bytes did not change since the last refresh is skipped. A file that is missing
  or fails to load (half-written in the middle of a burst) is never applied: it is read again
  once writes have settled (``settle`` seconds), and only then judged.
- ``signal``: SIGHUP (the daemon installs the handler before anything slow).
- ``api``: ``POST /admin/config/refresh`` and ``iop-edge config refresh``; synchronous — the
  caller gets the result of a refresh that started after its call.

File and signal triggers that arrive while a refresh runs coalesce into one more run. Each run:
read the file → load → validate → classify against the **running** config (in a worker thread:
a large config must not stall the event loop) → apply the live part to the scheduler and the
model catalog in one step of the loop (no request sees half a config) → record, log, notify.
Restart-class changes stay pending until a later file reverts them or the daemon restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import watchfiles

from iop_edge.config.refresh import (
    RefreshError,
    RefreshOutcome,
    RefreshResult,
    ReportEntry,
    config_hash,
    refresh,
)
from iop_edge.config.schema import EdgeConfig
from iop_edge.systemd import Notifier

Trigger = Literal["file", "signal", "api"]
TRIGGERS: Final = ("file", "signal", "api")


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


@dataclass
class SupervisorOptions:
    """Timing of the file watcher (seconds)."""

    debounce: float = 0.2
    settle: float = 1.0
    poll_interval: float = 30.0


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
        log: Any,
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
        self._queued: Trigger | None = None
        self._file_digest = self._digest(self._read_bytes())
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()
        self.runs = 0

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, *, watch: bool = True) -> None:
        """Start the worker (and, unless ``watch`` is false, the watcher and the poller)."""
        self._tasks.append(asyncio.create_task(self._worker(), name="refresh-worker"))
        if watch:
            self._tasks.append(asyncio.create_task(self._watch(), name="config-watch"))
            self._tasks.append(asyncio.create_task(self._poll(), name="config-poll"))

    async def stop(self) -> None:
        """Stop the background tasks."""
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    # -- triggers ----------------------------------------------------------------------------

    def request(self, trigger: Trigger) -> None:
        """Ask for a refresh soon (file events, SIGHUP); requests made while one runs
        coalesce into one more run."""
        # A signal outranks a file event in the record: it was an operator's explicit act.
        if self._queued != "signal":
            self._queued = trigger
        self._wake.set()

    async def refresh(self, trigger: Trigger, mode: str = "apply") -> RefreshResult:
        """Run a refresh now (after any running one) and return its result."""
        async with self._lock:
            result = await self._run(trigger, mode, force=True)
        assert result is not None  # a forced run always runs
        return result

    # -- the path ----------------------------------------------------------------------------

    async def _worker(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            trigger, self._queued = self._queued or "file", None
            async with self._lock:
                await self._run(trigger, "apply", force=trigger != "file")

    async def _run(self, trigger: Trigger, mode: str, *, force: bool) -> RefreshResult | None:
        """One refresh; ``None`` when not forced and the file's bytes are unchanged."""
        raw = self._read_bytes()
        digest = self._digest(raw)
        if not force and digest == self._file_digest:
            return None  # nothing new on disk since the last look
        if mode == "apply":
            self._file_digest = digest
            self._notifier.reloading()
        self.runs += 1
        if raw is None:
            outcome = self._rejected(
                mode, f"cannot read config {self.path}: the file is missing or unreadable"
            )
        else:
            text = raw.decode("utf-8", errors="replace")
            outcome = await asyncio.to_thread(
                refresh, self.running, text, mode=mode, env=self._env, source=str(self.path)
            )
        result = outcome.result
        if result.result == "rejected" and trigger == "file" and mode == "apply":
            # Possibly read mid-write (a burst of saves, delete + recreate): look again once
            # writes have settled, and judge the file by what it holds then.
            await asyncio.sleep(self.options.settle)
            if self._digest(self._read_bytes()) != digest:
                return await self._run(trigger, mode, force=True)
        if mode == "apply" and result.result != "rejected":
            result = self._take(outcome)
        record = RefreshRecord(trigger=trigger, at=time.time(), result=result)
        if mode == "apply":
            self._record(record)
            self._notifier.ready(status_line(self))
        return result

    def _take(self, outcome: RefreshOutcome) -> RefreshResult:
        """Swap in the live part (in this loop step) and update what is pending."""
        result = outcome.result
        if outcome.running is not self.running:
            try:
                self._apply(outcome.running)
            except Exception as exc:  # an apply failure rejects the whole refresh
                self._log.error("config_apply_failed", error=repr(exc))
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
        self._log.info(
            "config_refresh",
            trigger=record.trigger,
            result=result.result,
            hash=self.running_hash,
            generation=self.generation,
            changes=[
                {"path": e.path, "class": e.change_class, "applied": e.applied}
                for e in result.report
            ],
            errors=[f"{e.path}: {e.message}" if e.path else e.message for e in result.errors],
            restart_pending=[e.path for e in self.restart_pending],
        )
        for listener in self._listeners:
            listener(record)

    def _rejected(self, mode: str, message: str) -> RefreshOutcome:
        result = RefreshResult(
            mode=mode,
            result="rejected",
            errors=[RefreshError(path="", message=message)],
            config_hash=self.running_hash,
        )
        return RefreshOutcome(result=result, running=self.running, candidate=None)

    # -- the file ----------------------------------------------------------------------------

    def _read_bytes(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except OSError:
            return None

    @staticmethod
    def _digest(raw: bytes | None) -> str | None:
        return hashlib.sha256(raw).hexdigest() if raw is not None else None

    async def _watch(self) -> None:
        directory = self.path.parent
        first = True
        async for changes in watchfiles.awatch(
            directory,
            debounce=int(self.options.debounce * 1000),
            step=50,
            stop_event=self._stop,
            recursive=False,
            ignore_permission_denied=True,
            yield_on_timeout=True,
            rust_timeout=1000,
        ):
            # Every change in the directory counts: a rename-save, a symlink swap of `..data`
            # or a recreate may never name the file itself; unchanged bytes are skipped. The
            # first (timeout) round means the watch is up: look once for a change made before.
            if changes or first:
                self.request("file")
            first = False

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.options.poll_interval)
            if self._digest(self._read_bytes()) != self._file_digest:
                self.request("file")

    # -- status ------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The config part of ``/admin/status``."""
        return {
            "path": str(self.path),
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
