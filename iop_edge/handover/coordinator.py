"""The steps of a handover on either side, and the drain that ends a process.

Old side (:meth:`HandoverCoordinator.restart`, asked by ``iop-edge restart`` or ``SIGUSR2``):
check the phase, the command and the config file; start the new process with the listening
sockets whose address the new config keeps; wait until it is ready; stop accepting, hand it the
leases (:mod:`iop_edge.handover.channel`), relay what waits (:mod:`iop_edge.handover.relay`);
tell systemd the new main pid; drain once idle. A stop during all this cancels the handover
(:meth:`HandoverCoordinator.cancel`): a stop never becomes a restart. Each restart ends in one
:data:`~iop_edge.handover.result.RestartResult`, which the admin API answers and ``SIGUSR2``
logs as its ``to_json()``.

New side (:meth:`HandoverCoordinator.take_over`, then :meth:`~HandoverCoordinator.serving`):
before accepting, count the old process's leases as held; once ready, tell it so and follow its
releases; show the handover in :meth:`~HandoverCoordinator.statistics`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import subprocess
from collections.abc import Callable, Mapping
from typing import Final

from iop_edge.admission import AdmissionScheduler
from iop_edge.config.schema import EdgeConfig
from iop_edge.config_file import load_config_file
from iop_edge.errors import ConfigError
from iop_edge.handover.channel import (
    HANDOVER_FD_ENV,
    Channel,
    DrainTally,
    EndedRequest,
    HandoverStatistics,
    Predecessor,
    Successor,
)
from iop_edge.handover.relay import HandoverRelay
from iop_edge.handover.result import (
    HandedOver,
    RestartCancelled,
    RestartFailed,
    RestartRefused,
    RestartResult,
)
from iop_edge.options import ServeOptions
from iop_edge.runtime.activation import LISTENER_NAMES, activation_argv, activation_env
from iop_edge.runtime.lifecycle import Lifecycle, Phase
from iop_edge.runtime.listeners import Listener
from iop_edge.runtime.logs import Logger
from iop_edge.seams import Clock

__all__ = ["HANDOVER_IDLE_GRACE", "HandoverCoordinator"]

HANDOVER_IDLE_GRACE: Final = 2.0
"""Seconds an old process keeps its idle kept-alive connections after a handover, so that a
request a client sends on one is relayed instead of meeting a closed connection."""


class HandoverCoordinator:
    """The handover of one process, either side of it, and the drain of its listeners.

    ``listeners`` is the daemon's (read only); ``lifecycle`` is moved through ``handing_over``
    here; ``on_handed_over(pid)`` is called once the new process serves (the daemon passes its
    systemd notifications on), ``on_idle()`` when a drained old process may stop,
    ``on_stop_listening()`` once this process stopped listening for the new one (the daemon
    tells its node links to dial the new process: ``GOAWAY{handover}``).
    """

    def __init__(
        self,
        config: EdgeConfig,
        scheduler: AdmissionScheduler,
        listeners: Mapping[str, Listener],
        lifecycle: Lifecycle,
        relay: HandoverRelay,
        options: ServeOptions,
        *,
        clock: Clock,
        log: Logger,
        on_handed_over: Callable[[int], None],
        on_idle: Callable[[], None],
        on_stop_listening: Callable[[], None] | None = None,
    ) -> None:
        self.config = config
        self.scheduler = scheduler
        self.listeners = listeners
        self.lifecycle = lifecycle
        self.relay = relay
        self.clock = clock
        self.log = log
        #: the command, config file and environment a restart runs again, the drain timeout
        self.options = options
        self._on_handed_over = on_handed_over
        self._on_idle = on_idle
        self._on_stop_listening = on_stop_listening
        #: the process that took over from us, once a handover succeeded
        self.successor_pid: int | None = None
        self._successor: Successor | None = None
        #: after we handed over: what we finish, relay or cut (logged as we exit)
        self._drained: DrainTally | None = None
        #: the process we take over from: connected, then (once we serve) shown
        self._taking_over: Predecessor | None = None
        self._predecessor: Predecessor | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # -- new side ----------------------------------------------------------------------------

    async def take_over(self, fd: int, openai_url: str) -> None:
        """Started by a handover (the channel's end ``fd``): say we are ready, with where and
        how the old process relays to us, and count its leases, before accepting anything."""
        predecessor = await Predecessor.connect(fd, self.scheduler, self.clock)
        self._taking_over = predecessor
        await predecessor.take_over(os.getpid(), openai_url, self.relay.expect_relays())

    def serving(self) -> None:
        """This process is ready: a predecessor hears that we accept, and we follow its
        releases until it exits."""
        predecessor = self._taking_over
        if predecessor is None:
            return
        predecessor.serving()
        self._predecessor = predecessor
        self.log.info(
            "handover_taken",
            from_pid=predecessor.pid,
            inherited_leases=predecessor.inherited,
            duration_ms=round(predecessor.duration * 1000, 1),
        )

    def statistics(self) -> HandoverStatistics | None:
        """The handover this process took over by, if any."""
        predecessor = self._predecessor
        if predecessor is None:
            return None
        return HandoverStatistics(
            from_pid=predecessor.pid,
            at=predecessor.serving_since,
            duration=predecessor.duration,
            inherited_leases=predecessor.inherited,
            inherited_held=predecessor.held,
            relayed_requests=self.relay.relayed_in,
            old_running=predecessor.old_running,
        )

    # -- old side ----------------------------------------------------------------------------

    async def restart(self, ready_timeout: float = 60.0) -> RestartResult:
        """Hand the listening sockets and the pool over to a new process running the same
        command (``iop-edge restart``, ``SIGUSR2``; issue 14).

        Only a ready process restarts: while it starts, hands over, drains after a handover or
        stops, the restart is refused with its ``phase`` (:mod:`iop_edge.runtime.lifecycle`; a stop
        never becomes a restart). The config file is validated first: if it does not load,
        nothing happens and the answer lists its problems. If the new process fails to start
        or to become ready, it is stopped and this one keeps serving. Once it is ready, this
        process stops accepting, reports its leases, tells systemd (or the thin parent,
        :mod:`iop_edge.runtime.parent`) the new main pid, and drains (``on_idle`` once idle).
        """
        refusal = self.lifecycle.restart_refusal()
        if refusal is not None:
            return RestartRefused(refusal, phase=self.lifecycle.phase)
        argv, config_path = self.options.argv, self.options.config_path
        if not argv or config_path is None:
            return RestartRefused("this process has no command to restart")
        if os.getpid() == 1:  # a container's init (--no-parent): the container ends with it
            return RestartRefused(
                "this process is PID 1 (a container's init, started with --no-parent): the "
                "container would stop with it; run iop-edge serve without --no-parent (its "
                "thin parent stays PID 1 across restarts), or restart the container instead "
                "(SIGTERM drains it)"
            )
        try:
            candidate = load_config_file(str(config_path), self.options.env)
        except ConfigError as exc:
            return RestartRefused(
                "the config file does not load; nothing was restarted", errors=tuple(exc.problems)
            )
        self.lifecycle.enter(Phase.HANDING_OVER)
        try:
            return await self._hand_over(candidate, ready_timeout)
        finally:
            if self.lifecycle.phase is Phase.HANDING_OVER:  # it failed: serve on
                self.lifecycle.enter(Phase.READY)

    async def _hand_over(self, candidate: EdgeConfig, ready_timeout: float) -> RestartResult:
        # Pass the sockets whose address the new config keeps; a changed listen is bound anew.
        addresses = {
            "openai": (self.config.openai.listen, candidate.openai.listen),
            "metrics": (self.config.metrics.listen, candidate.metrics.listen),
            "console": (self.config.console.listen, candidate.console.listen),
            "nodes": (self.config.listen.address, candidate.listen.address),
        }
        names = [
            name
            for name in LISTENER_NAMES
            if name in self.listeners and addresses[name][0] == addresses[name][1]
        ]
        fds = [self.listeners[name].fileno for name in names]
        ours, theirs = socket.socketpair()
        env = activation_env(fds, self.options.env)
        env[HANDOVER_FD_ENV] = str(theirs.fileno())
        started = self.clock.now()
        try:
            # (not an asyncio subprocess: this process must be free to exit while the new
            # one runs on; the kernel reaps nothing it waits for)
            process = subprocess.Popen(
                activation_argv(self.options.argv, names), pass_fds=(*fds, theirs.fileno()), env=env
            )
        except OSError as exc:
            ours.close()
            return RestartFailed(f"the new process did not start: {exc}")
        finally:
            theirs.close()
        self._successor = successor = Successor(process, await Channel.open(ours))
        # A stop from here on aborts the handover (:meth:`cancel`).
        ready = not self.lifecycle.stopping and await successor.wait_ready(ready_timeout)
        if self.lifecycle.stopping:
            return await self._cancelled(successor)
        if not ready:
            self._successor = None
            if process.poll() is None:
                process.kill()
            code = await asyncio.to_thread(process.wait)
            successor.channel.close()
            self.log.warning(
                "handover_failed",
                exit_code=code,
                message="the new process did not become ready; this one keeps serving",
            )
            return RestartFailed(
                f"the new process did not become ready (exit code {code}); this one keeps serving"
            )
        # New is ready and waits for our leases: stop accepting (connections wait in the
        # kernel's backlog), report what we hold and every release from now on.
        for name, listener in self.listeners.items():
            if name == "openai":
                listener.stop_listening()  # (what comes on kept-alive connections is relayed)
            elif name == "nodes":
                # Only the listening socket: a node link carries requests in flight here until
                # this process is idle and its drain closes it. (stop_accepting would mark the
                # connections closing, and aiohttp then drops what they receive: the links'
                # answers and pongs, until the heartbeat declares them dead.)
                listener.stop_listening()
            else:  # the admin and metrics answer from new: close the idle connections here
                listener.stop_accepting()
        if self._on_stop_listening is not None:
            # Nodes dial the new process now; their old links serve until idle.
            self._on_stop_listening()
        successor.hand_over(self.scheduler, self.clock.now() - started)
        # What waits here, and what arrives on kept-alive connections from now on, goes to
        # the new process, keeping its age (its place and deadline there); /readyz says no.
        self.relay.hand_to(successor.openai_url, successor.secret)
        self._drained = DrainTally()
        at_handover = self.scheduler.statistics()  # (before the queue goes to new)
        self.scheduler.hand_over()
        if not await successor.wait_serving(ready_timeout):
            # Past the point of return (this process stopped listening): say so, go on.
            self.log.warning(
                "handover_unconfirmed",
                pid=successor.pid,
                message="the new process did not say it accepts connections; check it",
            )
        assert successor.pid is not None
        self.successor_pid = successor.pid
        self._on_handed_over(successor.pid)
        self.log.info(
            "handed_over",
            pid=successor.pid,
            in_flight=at_handover.in_flight,
            relayed_queued=at_handover.queue_depth,
            duration_ms=round((self.clock.now() - started) * 1000, 1),
        )
        if not self.lifecycle.stopping:  # (a stop now drains anyway; new was told to stop)
            self.lifecycle.enter(Phase.DRAINING)
            self._tasks.append(asyncio.create_task(self._stop_when_idle()))
        return HandedOver(successor.pid)

    def cancel(self) -> None:
        """A stop began during a handover: the new process must not serve on after this one
        (issue 25). Not yet handed the leases, it is killed; handed them, it is sent SIGTERM
        and drains too. (A process not started yet sees the stop in :meth:`restart`.)"""
        successor = self._successor
        if successor is None:
            return
        outcome = successor.abort()
        if outcome is None:  # (aborted before)
            return
        self.log.warning(
            "handover_cancelled",
            pid=successor.process.pid,
            new_process=outcome,
            message={
                "killed": "the daemon is stopping: the new process, which served nothing yet, "
                "was killed",
                "stopped": "the daemon is stopping: the new process had taken over and was "
                "sent SIGTERM; it drains too",
                "exited": "the daemon is stopping; the new process had exited",
            }[outcome],
        )

    async def _cancelled(self, successor: Successor) -> RestartCancelled:
        """The answer of a restart a stop cancelled, once the new process is gone."""
        self.cancel()  # (done already unless the stop began as it was started)
        code = await asyncio.to_thread(successor.process.wait)
        successor.channel.close()
        return RestartCancelled(code)

    def observe(self, record: EndedRequest) -> None:
        """A request ended (an observer of the server): counted once this process handed
        over, for the ``handover_drained`` line."""
        if self._drained is not None:
            self._drained.observe(record)

    async def _stop_when_idle(self) -> None:
        """After a handover: kept-alive connections may still carry requests (relayed, each
        answer closing its connection), so idle ones stay open until this process has no
        request in flight or being relayed, and a moment more; then the drain closes them."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.drain_timeout
        quiet_since: float | None = None
        while loop.time() < deadline:
            busy = self.scheduler.statistics().in_flight or self.relay.relaying
            now = loop.time()
            if busy:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since >= HANDOVER_IDLE_GRACE:
                break
            await asyncio.sleep(0.05)
        self._on_idle()

    # -- the end -----------------------------------------------------------------------------

    async def drain(self, listener: Listener, cut_at: float, deadline: float) -> None:
        """Let ``listener``'s requests finish until ``cut_at``; then cut what is left and wait
        for it to unwind until ``deadline``; release the listener."""
        listener.stop_accepting()
        if not await listener.drain(cut_at):
            if listener.name == "openai":
                self.relay.cut()  # the cut requests log 503 drain_timeout
            cut = listener.cut()
            self.log.warning(
                "drain_timeout",
                listener=listener.name,
                cut=cut,
                timeout_s=self.options.drain_timeout,
                message=f"cancelled {cut} connection(s) still busy when the drain ran out",
            )
            await listener.drain(deadline)
        await listener.close()

    async def aclose(self) -> None:
        """The process exits: stop waiting for idleness and following the old process, let
        the new one stop counting our leases, and say what this one did after it handed
        over."""
        for task in self._tasks:
            task.cancel()
        if self._predecessor is not None:
            await self._predecessor.aclose()
        if self._successor is not None:
            self._successor.channel.close()  # the new process stops counting our leases
        if self._drained is not None:
            drained = self._drained
            self.log.info(
                "handover_drained",
                pid=self.successor_pid,
                message=f"after handing over: {drained.finished} request(s) finished here "
                f"({drained.finished_streams} stream(s)), {drained.relayed} relayed to the new "
                f"process, {drained.cut} cut ({drained.cut_streams} stream(s))",
                **dataclasses.asdict(drained),
            )

    def __repr__(self) -> str:
        return f"<HandoverCoordinator {self.lifecycle.phase.value} {self.relay!r}>"
