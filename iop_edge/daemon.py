"""Wiring and lifecycle of ``iop-edge serve``.

Start: build the scheduler, the adapters and the OpenAI surface from the config; bind the
OpenAI, metrics and console listeners; start the supervisor (file watch, SIGHUP, admin refresh);
tell systemd ``READY=1``. Stop (SIGTERM/SIGINT), all within ``drain_timeout`` seconds of the
signal: ``STOPPING=1``, stop accepting, let requests in flight and in the queue finish until the
cancellation reserve (:func:`cancel_reserve`) before the end, cancel the rest (leases are
released, upstream calls aborted, CLI process groups killed), close upstream connections, exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import os
import secrets
import signal
import socket
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from iop_edge import sighup
from iop_edge.activation import LISTENER_NAMES, activation_argv, activation_env
from iop_edge.adapters.cli_process import KILL_GRACE_SECONDS
from iop_edge.adapters.registry import NodeAdapters
from iop_edge.admission import AdmissionScheduler, MonotonicClock
from iop_edge.api.admin import AdminAPI
from iop_edge.api.catalog import build_catalog
from iop_edge.api.guard import RequestGuard
from iop_edge.api.server import OpenAIServer
from iop_edge.config.policy import pool_policy
from iop_edge.config.schema import EdgeConfig
from iop_edge.config.validate import is_loopback
from iop_edge.config_file import load_config_file
from iop_edge.envelope import envelope
from iop_edge.errors import ConfigError, RequestError
from iop_edge.handover import (
    HANDOVER_FD_ENV,
    Channel,
    DrainTally,
    HandoverStatistics,
    Predecessor,
    Successor,
)
from iop_edge.lifecycle import Lifecycle, Phase
from iop_edge.listeners import (
    ADMIN_MAX_CONNECTIONS,
    ConnectionLimits,
    FdLimit,
    Listener,
    raise_fd_limit,
)
from iop_edge.logs import Logger, RequestLineWriter, flush_logs, get_logger
from iop_edge.metrics import EdgeMetrics
from iop_edge.pool import HealthEvent, ProviderKey
from iop_edge.runtime_record import remove_record, write_record
from iop_edge.seams import Clock
from iop_edge.supervisor import Supervisor, SupervisorOptions, status_line
from iop_edge.systemd import Notifier

DEFAULT_DRAIN_TIMEOUT = 30.0


HANDOVER_IDLE_GRACE = 2.0
"""Seconds an old process keeps its idle kept-alive connections after a handover, so that a
request a client sends on one is relayed instead of meeting a closed connection."""


GC_THRESHOLDS: Final = (50_000, 20, 20)
"""The collector's thresholds in ``serve`` (Python's are 700, 10, 10). Requests free their
objects by reference counting; the collector only walks what is still alive, so young
collections cost the same whichever the threshold, and are 70 times fewer. Fewer of them also
promote fewer objects of requests in flight to the old generation, whose full collections walk
every long-lived object — with 10,000 requests waiting, 160–290 ms each, 26 times in a
benchmark run, which was the tail at concurrency 64 (issue 16; ``bench/proxy_bench.py
--scaling-only``). Cyclic garbage waits for up to 50,000 allocations."""


def cancel_reserve(drain_timeout: float) -> float:
    """The end of a drain kept for cancelling what is still running: a quarter of the drain
    timeout, at most 2.5 s — the CLI kill grace (SIGTERM, then SIGKILL 2 s later to a group
    that lingers) and half a second to spare."""
    return min(drain_timeout / 4, KILL_GRACE_SECONDS + 0.5)


@dataclass
class Daemon:
    """The running edge: scheduler, adapters, listeners, supervisor, metrics, sd_notify."""

    config: EdgeConfig
    config_path: Path | None = None
    clock: Clock = field(default_factory=MonotonicClock)
    log: Logger = field(default_factory=get_logger)
    #: how request lines are written (``serve`` passes the fast JSON writer of its log setup)
    write_request_line: RequestLineWriter | None = None
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    notifier: Notifier = field(default_factory=Notifier)
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT
    supervisor_options: SupervisorOptions = field(default_factory=SupervisorOptions)
    #: watch the config file (tests turn it off); the config's ``reload.watch: false`` too
    watch: bool = True
    #: ``gc.freeze()`` and :data:`GC_THRESHOLDS` once started (the ``serve`` command; tests
    #: share one process and don't)
    freeze_gc: bool = False
    #: listening sockets passed in, by listener name (:mod:`iop_edge.activation`): used
    #: instead of binding that listener's configured address
    inherited: dict[str, socket.socket] = field(default_factory=dict)
    #: the command that started this process: a handover (:meth:`restart`) runs it again
    argv: tuple[str, ...] = ()
    #: our end of the channel to the process we take over from (a handover), if any
    handover_fd: int | None = None
    #: the process that took over from us, once a handover succeeded
    successor_pid: int | None = field(default=None, init=False)
    #: where this process is in its life (:mod:`iop_edge.lifecycle`); only the daemon moves it
    lifecycle: Lifecycle = field(default_factory=Lifecycle, init=False)
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    scheduler: AdmissionScheduler = field(init=False)
    adapters: NodeAdapters = field(init=False)
    server: OpenAIServer = field(init=False)
    metrics: EdgeMetrics = field(init=False)
    supervisor: Supervisor | None = field(init=False, default=None)
    listeners: dict[str, Listener] = field(default_factory=dict, init=False)
    stopped: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list, init=False)
    _predecessor: Predecessor | None = field(default=None, init=False)
    _successor: Successor | None = field(default=None, init=False)
    #: after we handed over: what we finish, relay or cut (logged as we exit)
    _drained: DrainTally | None = field(default=None, init=False)
    #: where the console's address is recorded for the command line (:mod:`runtime_record`)
    _console_record: Path | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.adapters = NodeAdapters.from_config(self.config, self.clock)
        self.scheduler = AdmissionScheduler(
            pool_policy(self.config),
            clock=self.clock,
            prober=self.adapters.probe,
            on_health=self._log_health,
        )
        self.metrics = EdgeMetrics(
            self.registry,
            self.scheduler.statistics,
            lambda: self.supervisor,
            lambda: [listener.statistics() for listener in self.listeners.values()],
            self.handover_statistics,
            config=self.config,
        )
        self.server = OpenAIServer(
            self.config,
            self.scheduler,
            self.adapters,
            clock=self.clock,
            logger=self.log,
            write_request_line=self.write_request_line,
            observers=[self.metrics.observe_request],
        )
        if self.config_path is not None:
            self.supervisor = Supervisor(
                self.config_path,
                self.config,
                apply=self.apply_config,
                env=self.env,
                log=self.log,
                listeners=[self.metrics.observe_refresh],
                options=self.supervisor_options,
                notifier=self.notifier,
            )

    def apply_config(self, config: EdgeConfig) -> None:
        """Swap the live part of ``config`` in: scheduler policy and catalog in one loop step
        (both are built before either is swapped, so a failure changes nothing)."""
        policy = pool_policy(config)
        catalog = build_catalog(config, created=self.server.load_times)
        self.scheduler.apply_policy(policy)
        self.server.swap_catalog(catalog)

    def _log_health(self, subject: ProviderKey | str, event: HealthEvent) -> None:
        """One log line per health event (SPEC §5.1): ejections, recoveries, panics."""
        if isinstance(subject, str):
            if event.kind == "panic":
                self.log.warning(
                    "model_panic",
                    model=subject,
                    message="every enabled provider of this model group is out (ejected, or held "
                    "by a 429): health is ignored for it (requests go to all of them) until one "
                    "is back",
                )
            else:
                self.log.info("model_panic_over", model=subject)
            return
        node, provider = subject
        left = None if event.until is None else round(event.until - self.clock.now(), 3)
        if event.kind == "ejected":
            trusted = event.probes_trusted
            if trusted is None:
                message = (
                    f"no health check: ejected for the full {left:g} s, then one trial request"
                )
            elif trusted:
                message = f"ejected for up to {left:g} s: a passing health check ends it early"
            else:
                message = (
                    f"probes pass but requests fail: ejected for the full {left:g} s, then one "
                    "trial request"
                )
            self.log.warning(
                "provider_ejected",
                node=node,
                provider=provider,
                consecutive_failures=event.failures,
                reason=event.reason,
                ejected_for_s=left,
                probes_trusted=trusted,
                message=message,
            )
        elif event.kind == "held":  # an upstream failure (a 429): a warning, like an ejection
            self.log.warning(
                "provider_held", node=node, provider=provider, held_for_s=left, reason=event.reason
            )
        elif event.kind == "half_open":
            self.log.info(
                "provider_half_open",
                node=node,
                provider=provider,
                message="the ejection ran out with no probe verdict: the next request is a trial",
            )
        else:
            self.log.info("provider_recovered", node=node, provider=provider, via=event.via)

    # -- addresses ---------------------------------------------------------------------------

    @property
    def openai_url(self) -> str:
        """Base URL of the OpenAI surface, ``http://host:port/v1``."""
        return self.listeners["openai"].url + "/v1"

    @property
    def console_url(self) -> str:
        """Base URL of the admin API."""
        return self.listeners["console"].url

    @property
    def metrics_url(self) -> str:
        """URL of ``/metrics``."""
        return self.listeners["metrics"].url + "/metrics"

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind the listeners and start the supervisor; the edge is ready once this returns."""
        config = self.config
        if self.server.auth.open:
            self.log.warning(
                "anonymous_access",
                listen=config.openai.listen,
                message="openai.principal_tokens is empty: every request is accepted as "
                "'anonymous'" + ("" if is_loopback(config.openai.listen) else " (allow_anonymous)"),
            )
        if config.metrics.enabled and not is_loopback(config.metrics.listen):
            self.log.warning(
                "metrics_not_loopback",
                listen=config.metrics.listen,
                message="metrics.listen is not a loopback address: /metrics has no "
                "authentication, and anyone who reaches it sees model, provider and token_ref "
                "names and the traffic; firewall it or listen on 127.0.0.1",
            )
        limits = ConnectionLimits.from_config(config.openai)
        # The admin listeners share the OpenAI listener's timeouts, with a small cap of their
        # own, at which they evict an idle or incomplete connection: the operator gets in.
        admin_limits = dataclasses.replace(
            limits, max_connections=ADMIN_MAX_CONNECTIONS, evict_idle=True
        )
        await self._bind("openai", self.server.build_app(), config.openai.listen, limits)
        predecessor = None
        if config.metrics.enabled:
            await self._bind("metrics", self._metrics_app(), config.metrics.listen, admin_limits)
        if config.console.enabled and self.supervisor is not None:
            admin = AdminAPI(
                config.edge.id,
                self.supervisor,
                self.scheduler,
                clock=self.clock,
                restart=self.restart,
                handover=self.handover_statistics,
            )
            await self._bind("console", admin.build_app(), config.console.listen, admin_limits)
        if self.handover_fd is not None:
            # Taking over: count the old process's leases before accepting anything.
            predecessor = await Predecessor.connect(self.handover_fd, self.scheduler, self.clock)
            self.server.handover_secret = secrets.token_urlsafe(24)
            await predecessor.take_over(
                os.getpid(), self.listeners["openai"].url, self.server.handover_secret
            )
            for listener in self.listeners.values():
                await listener.start_serving()
        for name, unused in self.inherited.items():
            self.log.warning(
                "listener_socket_unused",
                listener=name,
                message=f"a socket was passed in for the {name} listener, which this config "
                "does not enable; it is closed",
            )
            unused.close()
        self.inherited.clear()
        if self.supervisor is not None:
            self.supervisor.start(watch=self.watch and config.reload.watch)
        if self.notifier.watchdog_interval:
            self._tasks.append(asyncio.create_task(self._watchdog(self.notifier.watchdog_interval)))
        if self.freeze_gc:
            # Everything built so far lives as long as the process: move it out of the
            # collector's reach, so full collections walk only what requests allocate.
            gc.collect()
            gc.freeze()
            gc.set_threshold(*GC_THRESHOLDS)
        self.server.ready = True
        self.scheduler.start()  # idle providers are probed from now on
        self.lifecycle.enter(Phase.READY)
        self.notifier.ready(status_line(self.supervisor) if self.supervisor else "serving")
        if predecessor is not None:
            predecessor.serving()
            self._predecessor = predecessor
            self.log.info(
                "handover_taken",
                from_pid=predecessor.pid,
                inherited_leases=predecessor.inherited,
                duration_ms=round(predecessor.duration * 1000, 1),
            )
        self._record_console()
        self.log.info(
            "listening",
            edge=config.edge.id,
            config_watch=self.supervisor is not None and self.supervisor.watching,
            **{name: listener.url for name, listener in self.listeners.items()},
        )

    def _record_console(self) -> None:
        """Tell the command line where this daemon's admin API is (never fatal)."""
        console = self.listeners.get("console")
        if console is None or self.config_path is None:
            return
        try:
            self._console_record = write_record(self.config_path, console.url, self.env)
        except OSError as exc:
            self.log.warning(
                "console_not_recorded",
                error=str(exc),
                message="iop-edge status, restart and config refresh find this daemon only "
                "through console.listen of its config file (or --console)",
            )

    async def _bind(
        self, name: str, app: web.Application, address: str, limits: ConnectionLimits
    ) -> None:
        sock = self.inherited.pop(name, None)
        self.listeners[name] = listener = await Listener.bind(
            name,
            app,
            address,
            limits,
            clock=self.clock,
            log=self.log,
            sock=sock,
            serve=self.handover_fd is None,  # a successor accepts once it counted old's leases
        )
        if sock is not None:
            self.log.info(
                "listener_inherited",
                listener=name,
                address=listener.url,
                configured=address,
                message=f"serving {name} on the socket passed in ({listener.url}); its "
                "configured address is not bound",
            )

    async def stop(self) -> None:
        """Drain and stop, all within ``drain_timeout`` seconds: stop accepting, let work in
        flight and in the queue finish until :func:`cancel_reserve` before the end, cancel the
        rest, close the upstream connections.

        The console and metrics listeners keep answering during the drain (status and scrapes
        show it) and close once the OpenAI listener is done.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_timeout
        cut_at = deadline - cancel_reserve(self.drain_timeout)
        if self.lifecycle.enter(Phase.STOPPING) is Phase.HANDING_OVER:
            self._cancel_handover()
        self.notifier.stopping()
        self.server.ready = False
        openai = self.listeners.pop("openai", None)
        if openai is not None:
            openai.stop_accepting()
        stats = self.scheduler.statistics()
        self.log.info(
            "draining",
            in_flight=stats.in_flight,
            queued=stats.queue_depth,
            timeout_s=self.drain_timeout,
        )
        if self.supervisor is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(cut_at):
                    await self.supervisor.stop()
        if openai is not None:
            await self._drain(openai, cut_at, deadline)
        for listener in self.listeners.values():
            listener.stop_accepting()
        for listener in self.listeners.values():
            await self._drain(listener, deadline, deadline)
        self.listeners.clear()
        # CLI process groups cancelled at the cut get SIGTERM, and SIGKILL after the grace if
        # they linger: waiting for that may pass the deadline when the drain is shorter than
        # four graces, never by more than one.
        await self.scheduler.aclose()
        await self.server.aclose()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(max(deadline, loop.time() + KILL_GRACE_SECONDS + 0.5)):
                await self.adapters.aclose()
        for task in self._tasks:  # the watchdog pings until the very end
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
        if self._console_record is not None:
            with contextlib.suppress(OSError):
                remove_record(self._console_record)
        stats = self.scheduler.statistics()
        self.log.info("stopped", in_flight=stats.in_flight, queued=stats.queue_depth)
        self.notifier.close()
        flush_logs()

    def handover_statistics(self) -> HandoverStatistics | None:
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
            relayed_requests=self.server.relayed_in,
            old_running=predecessor.old_running,
        )

    async def restart(self, ready_timeout: float = 60.0) -> dict[str, Any]:
        """Hand the listening sockets and the pool over to a new process running the same
        command (``iop-edge restart``, ``SIGUSR2``; issue 14, :mod:`iop_edge.handover`).

        Only a ready process restarts: while it starts, hands over, drains after a handover or
        stops, the answer is ``rejected`` with its ``phase`` (:mod:`iop_edge.lifecycle`; a stop
        never becomes a restart). The config file is validated first: if it does not load,
        nothing happens and the answer lists its problems. If the new process fails to start
        or to become ready, it is stopped and this one keeps serving. Once it is ready, this
        process stops accepting, reports its leases, tells systemd (or the thin parent,
        :mod:`iop_edge.parent`) the new main pid, and drains (``stopped`` is set).
        """
        refusal = self.lifecycle.restart_refusal()
        if refusal is not None:
            return {"result": "rejected", "phase": self.lifecycle.phase.value, "message": refusal}
        if not self.argv or self.config_path is None:
            return {"result": "rejected", "message": "this process has no command to restart"}
        if os.getpid() == 1:  # a container's init (--no-parent): the container ends with it
            return {
                "result": "rejected",
                "message": "this process is PID 1 (a container's init, started with "
                "--no-parent): the container would stop with it; run iop-edge serve without "
                "--no-parent (its thin parent stays PID 1 across restarts), or restart the "
                "container instead (SIGTERM drains it)",
            }
        try:
            candidate = load_config_file(str(self.config_path), self.env)
        except ConfigError as exc:
            return {
                "result": "rejected",
                "message": "the config file does not load; nothing was restarted",
                "errors": [{"path": p.path, "message": p.message} for p in exc.problems],
            }
        self.lifecycle.enter(Phase.HANDING_OVER)
        try:
            return await self._hand_over(candidate, ready_timeout)
        finally:
            if self.lifecycle.phase is Phase.HANDING_OVER:  # it failed: serve on
                self.lifecycle.enter(Phase.READY)

    async def _hand_over(self, candidate: EdgeConfig, ready_timeout: float) -> dict[str, Any]:
        # Pass the sockets whose address the new config keeps; a changed listen is bound anew.
        addresses = {
            "openai": (self.config.openai.listen, candidate.openai.listen),
            "metrics": (self.config.metrics.listen, candidate.metrics.listen),
            "console": (self.config.console.listen, candidate.console.listen),
        }
        names = [
            name
            for name in LISTENER_NAMES
            if name in self.listeners and addresses[name][0] == addresses[name][1]
        ]
        fds = [self.listeners[name].fileno for name in names]
        ours, theirs = socket.socketpair()
        env = activation_env(fds, self.env)
        env[HANDOVER_FD_ENV] = str(theirs.fileno())
        started = self.clock.now()
        try:
            # (not an asyncio subprocess: this process must be free to exit while the new
            # one runs on; the kernel reaps nothing it waits for)
            process = subprocess.Popen(
                activation_argv(self.argv, names), pass_fds=(*fds, theirs.fileno()), env=env
            )
        except OSError as exc:
            ours.close()
            return {"result": "failed", "message": f"the new process did not start: {exc}"}
        finally:
            theirs.close()
        self._successor = successor = Successor(process, await Channel.open(ours))
        # A stop from here on aborts the handover (:meth:`_cancel_handover`).
        ready = not self.lifecycle.stopping and await successor.wait_ready(ready_timeout)
        if self.lifecycle.stopping:
            return await self._handover_cancelled(successor)
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
            return {
                "result": "failed",
                "message": f"the new process did not become ready (exit code {code}); this "
                "one keeps serving",
            }
        # New is ready and waits for our leases: stop accepting (connections wait in the
        # kernel's backlog), report what we hold and every release from now on.
        self.server.ready = False
        for name, listener in self.listeners.items():
            if name == "openai":
                listener.stop_listening()  # (what comes on kept-alive connections is relayed)
            else:  # the admin and metrics answer from new: close the idle connections here
                listener.stop_accepting()
        successor.hand_over(self.scheduler, self.clock.now() - started)
        # What waits here, and what arrives on kept-alive connections from now on, goes to
        # the new process, keeping its age (its place and deadline there).
        self.server.successor = successor.openai_url
        self.server.handover_secret = successor.secret
        self._drained = drained = DrainTally()
        self.server.observers.append(drained.observe)
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
        self.notifier.notify(f"MAINPID={successor.pid}")
        self.notifier.close()
        self.notifier = Notifier({})  # the new process speaks to systemd from now on
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
        return {"result": "handed_over", "pid": successor.pid}

    def _cancel_handover(self) -> None:
        """A stop began during a handover: the new process must not serve on after this one
        (issue 25). Not yet handed the leases, it is killed; handed them, it is sent SIGTERM
        and drains too. (A process not started yet sees the stop in :meth:`_hand_over`.)"""
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

    async def _handover_cancelled(self, successor: Successor) -> dict[str, Any]:
        """The answer of a restart a stop cancelled, once the new process is gone."""
        self._cancel_handover()  # (done already unless the stop began as it was started)
        code = await asyncio.to_thread(successor.process.wait)
        successor.channel.close()
        return {
            "result": "rejected",
            "phase": Phase.STOPPING.value,
            "message": "the daemon began to stop during the handover: the new process was "
            f"stopped (exit code {code}) and nothing was restarted",
        }

    async def _stop_when_idle(self) -> None:
        """After a handover: kept-alive connections may still carry requests (relayed, each
        answer closing its connection), so idle ones stay open until this process has no
        request in flight or being relayed, and a moment more; then the drain closes them."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_timeout
        quiet_since: float | None = None
        while loop.time() < deadline:
            busy = self.scheduler.statistics().in_flight or self.server.relaying
            now = loop.time()
            if busy:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since >= HANDOVER_IDLE_GRACE:
                break
            await asyncio.sleep(0.05)
        self.stopped.set()

    async def _drain(self, listener: Listener, cut_at: float, deadline: float) -> None:
        """Let ``listener``'s requests finish until ``cut_at``; then cut what is left and wait
        for it to unwind until ``deadline``; release the listener."""
        listener.stop_accepting()
        if not await listener.drain(cut_at):
            if listener.name == "openai":
                self.server.cutting = True  # the cut requests log 503 drain_timeout
            cut = listener.cut()
            self.log.warning(
                "drain_timeout",
                listener=listener.name,
                cut=cut,
                timeout_s=self.drain_timeout,
                message=f"cancelled {cut} connection(s) still busy when the drain ran out",
            )
            await listener.drain(deadline)
        await listener.close()

    async def run(self, *, early_signals: Sequence[int] = ()) -> int:
        """Serve until SIGTERM or SIGINT, then drain and stop; returns the exit code.

        SIGHUP asks the supervisor for a refresh, SIGUSR2 for a restart. ``early_signals``
        holds those that arrived before the loop's handlers were installed
        (:mod:`iop_edge.sighup`): a SIGHUP among them queues one refresh once started; a
        SIGUSR2 is logged and ignored (the process runs what it has just loaded). The soft
        open-file limit is raised to the hard one first.
        """
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stopped.set)
        loop.add_signal_handler(signal.SIGHUP, self._on_hup)
        loop.add_signal_handler(signal.SIGUSR2, self._on_usr2)
        try:
            self._log_fd_limit(raise_fd_limit())
            await self.start()
            # (read after the loop's handlers went in: none is lost)
            if signal.SIGHUP in early_signals:
                self._on_hup()
            if signal.SIGUSR2 in early_signals:
                self._restart_signal_ignored(Phase.STARTING)
            await self.stopped.wait()
        finally:
            await self.stop()
            sighup.hand_back(loop)
        return 0

    def _log_fd_limit(self, limit: FdLimit) -> None:
        config = self.config
        caps = config.openai.max_connections + ADMIN_MAX_CONNECTIONS * 2
        self.log.info("fd_limit", soft_before=limit.soft_before, soft=limit.soft, hard=limit.hard)
        # Each connection is a descriptor; requests add upstream sockets and CLI pipes.
        if caps * 2 > limit.soft:
            self.log.warning(
                "fd_limit_low",
                soft=limit.soft,
                max_connections=config.openai.max_connections,
                message=f"the open-file limit {limit.soft} is below twice the listeners' "
                f"connection caps ({caps}): under load new connections may be reset before "
                "the caps refuse them; raise LimitNOFILE or lower openai.max_connections",
            )

    def _on_usr2(self) -> None:
        """SIGUSR2: hand over to a new process (as ``iop-edge restart``) — when ready; in any
        other phase it is logged and ignored (a stop never becomes a restart)."""
        if self.lifecycle.phase is not Phase.READY:
            self._restart_signal_ignored(self.lifecycle.phase)
            return

        async def restart() -> None:
            result = await self.restart()
            if result["result"] != "handed_over":
                self.log.warning("restart_refused", **result)

        self._tasks.append(asyncio.create_task(restart()))

    def _restart_signal_ignored(self, phase: Phase) -> None:
        if phase is Phase.STARTING:
            message = sighup.RESTART_SIGNAL_WHILE_STARTING
        else:
            message = f"a restart signal (SIGUSR2) is ignored: {Lifecycle.refusal_in(phase)}"
        self.log.warning(
            "restart_signal_ignored", signal="SIGUSR2", phase=phase.value, message=message
        )

    def _on_hup(self) -> None:
        if self.supervisor is not None:
            self.supervisor.request("signal")

    async def _watchdog(self, interval: float) -> None:
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(interval)

    def _metrics_app(self) -> web.Application:
        # prometheus-client's own handler: content negotiation (OpenMetrics) and name[]
        # filters, nothing hand-written to keep in step with the exposition formats. No gzip:
        # aiohttp compresses in the loop's thread pool, and a scrape must answer even when
        # that pool is exhausted (the moment an operator looks).
        # The console's browser rules (a page could read token refs, models and traffic
        # through DNS rebinding): no Origin at all; on loopback, loopback Host names only. Off
        # loopback the operator chose the network (metrics_not_loopback warns at start).
        listen = self.config.metrics.listen
        guard = RequestGuard(
            allowed_origins=(),
            loopback_hosts_only=is_loopback(listen),
            no_origin="/metrics answers no web page (a scraper sends no Origin header).",
            why_loopback=f"metrics.listen is the loopback address {listen}; a scraper on this "
            "machine asks for it by one of those names.",
        )

        @web.middleware
        async def checks(request: web.Request, handler: Handler) -> web.StreamResponse:
            try:
                guard.check(request.headers)
            except RequestError as exc:
                body = envelope(str(exc), exc.code, status=exc.status)
                return web.Response(body=body, status=exc.status, content_type="application/json")
            return await handler(request)

        app = web.Application(middlewares=[checks])
        app.router.add_get(
            "/metrics", make_aiohttp_handler(self.registry, disable_compression=True)
        )
        return app
