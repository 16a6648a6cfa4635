"""Wiring and lifecycle of ``iop-edge serve``.

Start: build the scheduler, the adapters and the OpenAI surface from the config; bind the
OpenAI, metrics and console listeners; start the supervisor (file watch, SIGHUP, admin refresh);
tell systemd ``READY=1``. Stop (SIGTERM/SIGINT): ``STOPPING=1``, stop accepting, let requests in
flight and in the queue finish for up to ``drain_timeout`` seconds, cancel the rest (leases are
released, CLI process groups killed), close upstream connections, exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from iop_edge.admission import AdmissionScheduler, MonotonicClock
from iop_edge.api.admin import AdminAPI
from iop_edge.api.catalog import build_catalog, pool_policy
from iop_edge.api.server import Executors, OpenAIServer
from iop_edge.config.schema import EdgeConfig
from iop_edge.config.validate import is_loopback
from iop_edge.logs import flush_logs, get_logger
from iop_edge.metrics import EdgeMetrics
from iop_edge.seams import Clock
from iop_edge.supervisor import Supervisor, SupervisorOptions, status_line
from iop_edge.systemd import Notifier

DEFAULT_DRAIN_TIMEOUT = 30.0


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) → ``(host, port)``."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


@dataclass
class Listener:
    """One bound aiohttp site and the address it actually listens on (port 0 resolved)."""

    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        """``http://host:port`` of the listener."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


async def bind(app: web.Application, address: str, *, drain_timeout: float = 5.0) -> Listener:
    """Serve ``app`` on ``address``. Client disconnects cancel their handler; on cleanup the
    runner stops accepting, waits up to ``drain_timeout`` for handlers, then cancels them."""
    runner = web.AppRunner(
        app, handler_cancellation=True, access_log=None, shutdown_timeout=drain_timeout
    )
    await runner.setup()
    host, port = split_address(address)
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    bound_port = runner.addresses[0][1]  # the real port when 0 was asked for
    return Listener(runner=runner, host=host, port=bound_port)


@dataclass
class Daemon:
    """The running edge: scheduler, adapters, listeners, supervisor, metrics, sd_notify."""

    config: EdgeConfig
    config_path: Path | None = None
    clock: Clock = field(default_factory=MonotonicClock)
    log: Any = field(default_factory=get_logger)
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    notifier: Notifier = field(default_factory=Notifier)
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT
    supervisor_options: SupervisorOptions = field(default_factory=SupervisorOptions)
    watch: bool = True
    #: ``gc.freeze()`` once started (the ``serve`` command; tests share one process and don't)
    freeze_gc: bool = False
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    scheduler: AdmissionScheduler = field(init=False)
    executors: Executors = field(init=False)
    server: OpenAIServer = field(init=False)
    metrics: EdgeMetrics = field(init=False)
    supervisor: Supervisor | None = field(init=False, default=None)
    listeners: dict[str, Listener] = field(default_factory=dict, init=False)
    stopped: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.scheduler = AdmissionScheduler(pool_policy(self.config), clock=self.clock)
        self.executors = Executors.from_config(self.config)
        self.metrics = EdgeMetrics(
            self.registry, self.scheduler.statistics, lambda: self.supervisor
        )
        self.server = OpenAIServer(
            self.config,
            self.scheduler,
            self.executors,
            clock=self.clock,
            logger=self.log,
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
        catalog = build_catalog(config, created=int(time.time()))
        self.scheduler.apply_policy(policy)
        self.server.swap_catalog(catalog)

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
        self.listeners["openai"] = await bind(
            self.server.build_app(), config.openai.listen, drain_timeout=self.drain_timeout
        )
        if config.metrics.enabled:
            self.listeners["metrics"] = await bind(self._metrics_app(), config.metrics.listen)
        if config.console.enabled and self.supervisor is not None:
            admin = AdminAPI(config.edge.id, self.supervisor, self.scheduler)
            self.listeners["console"] = await bind(admin.build_app(), config.console.listen)
        if self.supervisor is not None:
            self.supervisor.start(watch=self.watch)
        if self.notifier.watchdog_interval:
            self._tasks.append(asyncio.create_task(self._watchdog(self.notifier.watchdog_interval)))
        if self.freeze_gc:
            # Everything built so far lives as long as the process: move it out of the
            # collector's reach, so full collections walk only what requests allocate.
            gc.collect()
            gc.freeze()
        self.server.ready = True
        self.notifier.ready(status_line(self.supervisor) if self.supervisor else "serving")
        self.log.info(
            "listening",
            edge=config.edge.id,
            **{name: listener.url for name, listener in self.listeners.items()},
        )

    async def stop(self) -> None:
        """Drain and stop: stop accepting, let work finish up to ``drain_timeout``, cancel the
        rest, close the upstream connections."""
        self.notifier.stopping()
        self.server.ready = False
        stats = self.scheduler.statistics()
        self.log.info(
            "draining",
            in_flight=stats.in_flight,
            queued=stats.queue_depth,
            timeout_s=self.drain_timeout,
        )
        for task in self._tasks:
            task.cancel()
        if self.supervisor is not None:
            await self.supervisor.stop()
        openai = self.listeners.pop("openai", None)
        if openai is not None:
            await openai.runner.cleanup()  # waits for in-flight and queued requests, bounded
        for listener in self.listeners.values():
            await listener.runner.cleanup()
        self.listeners.clear()
        await self.executors.aclose()
        stats = self.scheduler.statistics()
        self.log.info("stopped", in_flight=stats.in_flight, queued=stats.queue_depth)
        self.notifier.close()
        flush_logs()

    async def run(self, *, hup_pending: bool = False) -> int:
        """Serve until SIGTERM or SIGINT, then drain and stop; returns the exit code.

        SIGHUP asks the supervisor for a refresh; ``hup_pending`` says one arrived during
        start-up (before the loop's handler was installed), which queues a refresh.
        """
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stopped.set)
        loop.add_signal_handler(signal.SIGHUP, self._on_hup)
        try:
            await self.start()
            if hup_pending:
                self._on_hup()
            await self.stopped.wait()
        finally:
            await self.stop()
        return 0

    def _on_hup(self) -> None:
        if self.supervisor is not None:
            self.supervisor.request("signal")

    async def _watchdog(self, interval: float) -> None:
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(interval)

    def _metrics_app(self) -> web.Application:
        async def scrape(request: web.Request) -> web.Response:
            body = generate_latest(self.registry)
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

        app = web.Application()
        app.router.add_get("/metrics", scrape)
        return app


@contextlib.contextmanager
def early_sighup() -> Any:
    """Install a SIGHUP handler at once (Python's default would kill the process) that only
    remembers the signal; yields a list that is non-empty once one arrived."""
    seen: list[int] = []
    previous = signal.signal(signal.SIGHUP, lambda signum, frame: seen.append(signum))
    try:
        yield seen
    finally:
        signal.signal(signal.SIGHUP, previous)
