"""Wiring and lifecycle of ``iop-edge serve``: build the parts from the config, bind the
listeners, serve until told to stop, and stop cleanly."""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from iop_edge.admission import AdmissionScheduler, MonotonicClock
from iop_edge.api.catalog import pool_policy
from iop_edge.api.server import Executors, OpenAIServer
from iop_edge.config.schema import EdgeConfig
from iop_edge.config.validate import is_loopback
from iop_edge.logs import get_logger
from iop_edge.seams import Clock


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


async def bind(app: web.Application, address: str) -> Listener:
    """Start serving ``app`` on ``address``; client disconnects cancel their handler."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    host, port = split_address(address)
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    server = site._server  # the bound socket tells the real port when 0 was asked for
    sockets = getattr(server, "sockets", None) or []
    bound_port = sockets[0].getsockname()[1] if sockets else port
    return Listener(runner=runner, host=host, port=bound_port)


@dataclass
class Daemon:
    """The running edge: scheduler, adapters, the OpenAI surface and its listener."""

    config: EdgeConfig
    clock: Clock = field(default_factory=MonotonicClock)
    log: Any = field(default_factory=get_logger)
    scheduler: AdmissionScheduler = field(init=False)
    executors: Executors = field(init=False)
    server: OpenAIServer = field(init=False)
    listeners: dict[str, Listener] = field(default_factory=dict, init=False)
    stopped: asyncio.Event = field(default_factory=asyncio.Event, init=False)

    def __post_init__(self) -> None:
        self.scheduler = AdmissionScheduler(pool_policy(self.config), clock=self.clock)
        self.executors = Executors.from_config(self.config)
        self.server = OpenAIServer(
            self.config, self.scheduler, self.executors, clock=self.clock, logger=self.log
        )

    @property
    def openai_url(self) -> str:
        """Base URL of the OpenAI surface, ``http://host:port/v1``."""
        return self.listeners["openai"].url + "/v1"

    async def start(self) -> None:
        """Bind the listeners; the edge is ready once this returns."""
        openai = self.config.openai
        if self.server.auth.open:
            self.log.warning(
                "anonymous_access",
                listen=openai.listen,
                message="openai.principal_tokens is empty: every request is accepted as "
                "'anonymous'" + ("" if is_loopback(openai.listen) else " (allow_anonymous)"),
            )
        self.listeners["openai"] = await bind(self.server.build_app(), openai.listen)
        self.server.ready = True
        self.log.info("listening", openai=self.openai_url, edge=self.config.edge.id)

    async def stop(self) -> None:
        """Stop accepting, close the listeners and the upstream connections."""
        self.server.ready = False
        for listener in self.listeners.values():
            await listener.runner.cleanup()
        self.listeners.clear()
        await self.executors.aclose()
        self.log.info("stopped")

    async def run(self) -> int:
        """Serve until SIGTERM or SIGINT, then stop; returns the exit code."""
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stopped.set)
        try:
            await self.start()
            await self.stopped.wait()
        finally:
            await self.stop()
        return 0
