"""One run of a CLI agent in its own process group, and the tracker that leaves none behind.

A :class:`CliRun` starts ``command`` + ``args`` with ``start_new_session=True`` (a new session,
so a new process group whose id is the leader's pid), feeds the prompt to stdin and closes it,
keeps the last :data:`STDERR_TAIL_BYTES` of stderr, and hands stdout out chunk by chunk up to
:data:`MAX_OUTPUT_BYTES`.

Ending a group:

- the leader exits on its own: whatever else still runs in its group is an orphan and is
  SIGKILLed at once (the leader's exit is seen through a pidfd, so an orphan holding stdout
  open cannot keep the call waiting);
- timeout, cancellation, an abandoned stream, a flood, an answer cut at ``max_tokens`` or a
  closing adapter (:meth:`CliRun.abort`): SIGTERM to the group now, then — in a background
  task the :class:`CliTracker` keeps — SIGKILL to the group after at most
  :data:`KILL_GRACE_SECONDS`, the pipes drained to their end and the leader reaped.
  :meth:`CliRun.stopped` waits for that (the adapter does, before its call ends, so the slot
  is released only once the group is gone); :meth:`CliTracker.aclose` waits for every group.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping, Sequence
from typing import Any, Final

from iop_edge.errors import AdapterError

__all__ = [
    "INHERITED_ENV",
    "KILL_GRACE_SECONDS",
    "MAX_OUTPUT_BYTES",
    "STDERR_TAIL_BYTES",
    "CliRun",
    "CliTracker",
    "minimal_env",
]

INHERITED_ENV: Final = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
)
"""Variables passed from the daemon's environment to a CLI (those that are set), before the
``env`` execution field is applied. Nothing else leaks through: no credentials of the daemon."""

MAX_OUTPUT_BYTES: Final = 8 * 1024 * 1024
"""Cap on what one run may write to stdout; past it the group is killed and the call fails."""

STDERR_TAIL_BYTES: Final = 2048
"""How much of the end of stderr an error message carries."""

KILL_GRACE_SECONDS: Final = 2.0
"""Between SIGTERM and SIGKILL when a group is stopped."""

_READ_SIZE: Final = 64 * 1024
_DRAIN_SECONDS: Final = 5.0


def minimal_env(extra: Mapping[str, str] | None) -> dict[str, str]:
    """The environment of a CLI: :data:`INHERITED_ENV` from ours (``PATH`` defaulting to
    :data:`os.defpath`), then ``extra`` (the ``env`` execution field) on top."""
    env = {name: os.environ[name] for name in INHERITED_ENV if name in os.environ}
    env.setdefault("PATH", os.defpath)
    if extra:
        env.update(extra)
    return env


class CliTracker:
    """The runs of one ``cli`` adapter instance that are still alive or being reaped."""

    def __init__(self, adapter_name: str) -> None:
        self.adapter_name = adapter_name
        self.runs: set[CliRun] = set()
        self.reapers: set[asyncio.Task[None]] = set()
        self.closed = False

    @property
    def live_process_groups(self) -> int:
        """Process groups started and not yet reaped (a group being killed still counts)."""
        return len(self.runs)

    @property
    def kills_pending(self) -> int:
        """Reapers still running: groups sent SIGTERM, waiting for their exit or the SIGKILL."""
        return len(self.reapers)

    async def aclose(self) -> None:
        """Stop every group still running and wait until all are reaped; idempotent."""
        self.closed = True
        for run in list(self.runs):
            run.abort()
        while self.reapers:
            await asyncio.gather(*self.reapers, return_exceptions=True)


class CliRun:
    """One running CLI process group (see the module docstring)."""

    def __init__(self, process: asyncio.subprocess.Process, label: str, tracker: CliTracker):
        self.pid = process.pid
        """The leader's pid, which is also the process group id."""
        self.label = label
        self._process = process
        self._tracker = tracker
        self._output = 0
        self._stderr = bytearray()
        self._reaper: asyncio.Task[None] | None = None
        self._helpers: list[asyncio.Task[Any]] = []
        self._finished = False
        self._leader_exited: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @classmethod
    async def start(
        cls,
        argv: Sequence[str],
        env: Mapping[str, str],
        prompt: bytes,
        label: str,
        tracker: CliTracker,
    ) -> CliRun:
        """Spawn ``argv`` in a new process group and start feeding it ``prompt``."""
        if tracker.closed:
            raise AdapterError(
                "upstream_error",
                f"{label} is closed (the daemon is stopping); not started",
                failure=None,
            )
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=dict(env),
                start_new_session=True,
            )
        except OSError as exc:
            raise AdapterError(
                "upstream_error",
                f"{label} could not be started: {exc.strerror or exc}",
                failure="connect",  # (nothing ran: retry_on's connect class)
                failover=True,
            ) from exc
        run = cls(process, label, tracker)
        tracker.runs.add(run)
        loop = asyncio.get_running_loop()
        run._helpers = [
            loop.create_task(run._feed(prompt)),
            loop.create_task(run._keep_stderr_tail()),
        ]
        run._watch_leader(loop)
        return run

    # -- while it runs -----------------------------------------------------------------------

    def _watch_leader(self, loop: asyncio.AbstractEventLoop) -> None:
        """Resolve ``_leader_exited`` when the leader exits, then SIGKILL its group: what is
        left is orphans, which may hold our pipes open.

        A pidfd tells the moment the leader exits; ``Process.wait()`` cannot, as it also waits
        for the pipes to close — which an orphan holding stdout would prevent.
        """

        def exited() -> None:
            if not self._leader_exited.done():
                self._leader_exited.set_result(None)
            self._signal(signal.SIGKILL)

        try:
            pidfd = os.pidfd_open(self.pid)
        except OSError:  # no pidfd support, or the leader is already gone and reaped
            waiter = loop.create_task(self._process.wait())
            waiter.add_done_callback(lambda _: exited())
            self._helpers.append(waiter)
            return

        def readable() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            exited()

        loop.add_reader(pidfd, readable)

    async def _feed(self, prompt: bytes) -> None:
        stdin = self._process.stdin
        assert stdin is not None
        try:
            stdin.write(prompt)
            await stdin.drain()
        except OSError:
            pass  # the command does not read (all of) its stdin: its choice
        finally:
            stdin.close()

    async def _keep_stderr_tail(self) -> None:
        stderr = self._process.stderr
        assert stderr is not None
        while chunk := await stderr.read(_READ_SIZE):
            self._stderr += chunk
            if len(self._stderr) > 2 * STDERR_TAIL_BYTES:
                del self._stderr[:-STDERR_TAIL_BYTES]

    def stderr_tail(self) -> str:
        """The last :data:`STDERR_TAIL_BYTES` of stderr, decoded leniently and trimmed."""
        tail = bytes(self._stderr[-STDERR_TAIL_BYTES:])
        return tail.decode("utf-8", errors="replace").strip()

    @property
    def silent(self) -> bool:
        """Nothing has come out of stdout yet."""
        return self._output == 0

    async def read(self) -> bytes:
        """The next chunk of stdout as it arrives; ``b""`` at its end. The caller bounds it
        with its deadline; past :data:`MAX_OUTPUT_BYTES` in total it raises ``upstream_error``.
        """
        stdout = self._process.stdout
        assert stdout is not None
        chunk = await stdout.read(_READ_SIZE)
        self._output += len(chunk)
        if self._output > MAX_OUTPUT_BYTES:
            raise AdapterError(
                "upstream_error",
                f"{self.label} wrote more than {MAX_OUTPUT_BYTES} bytes to stdout "
                "(the cap of one answer); it was stopped",
            )
        return chunk

    async def finish(self) -> None:
        """After stdout ended: wait for the exit (the caller bounds it) and check its status.

        A non-zero status raises ``upstream_error`` with the tail of stderr.
        """
        status = await self._process.wait()
        # asyncio.wait, not await: a cancelled caller must not cancel the helpers.
        await asyncio.wait(self._helpers)
        self._finished = True
        self._tracker.runs.discard(self)
        if status == 0:
            return
        if status < 0:
            how = f"was killed by {signal.Signals(-status).name}"
        else:
            how = f"exited with status {status}"
        tail = self.stderr_tail()
        raise AdapterError(
            "upstream_error",
            f"{self.label} {how}; " + (f"stderr ends with: {tail}" if tail else "stderr is empty"),
            failure="exit",
            failover=self._output == 0,
        )

    # -- stopping ----------------------------------------------------------------------------

    def _signal(self, signum: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signum)

    def abort(self) -> None:
        """Stop the group: SIGTERM now, SIGKILL after the grace, in a tracked background task.

        Idempotent; does nothing once :meth:`finish` saw the group end.
        """
        if self._reaper is None and not self._finished:
            if not self._leader_exited.done():
                self._signal(signal.SIGTERM)
            self._reaper = asyncio.get_running_loop().create_task(self._reap())
            self._tracker.reapers.add(self._reaper)
            self._reaper.add_done_callback(self._tracker.reapers.discard)

    async def stopped(self) -> None:
        """After :meth:`abort`: return once the group is gone (reaped). Shielded: a caller
        cancelled meanwhile stops waiting, the reaper goes on."""
        reaper = self._reaper
        if reaper is not None and not reaper.done():
            await asyncio.shield(reaper)

    async def _reap(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(KILL_GRACE_SECONDS):
                await asyncio.shield(self._leader_exited)
        self._signal(signal.SIGKILL)
        # Drain what the dead group left in stdout so its transport sees the end and closes,
        # then reap the leader. Bounded, in case a process escaped the group (setsid) and
        # keeps a pipe open.
        stdout = self._process.stdout
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_DRAIN_SECONDS):
                with contextlib.suppress(RuntimeError):  # a reader is still there: it drains
                    while stdout is not None and await stdout.read(_READ_SIZE):
                        pass
                await self._process.wait()
                await asyncio.wait(self._helpers)
        for helper in self._helpers:
            helper.cancel()
        self._tracker.runs.discard(self)
