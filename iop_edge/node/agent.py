"""The life of one ``iop-node`` process (:class:`NodeAgent`).

This first cut holds the process's shell alone: sd_notify (``READY`` once the options are
valid, ``WATCHDOG`` from the loop, ``STOPPING`` on SIGTERM) and the stop; the dial loop over
the node link comes with :mod:`iop_edge.node.runner`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import ssl

from iop_edge import __version__
from iop_edge.node.options import EXIT_DRAINED, NodeOptions
from iop_edge.runtime.logs import Logger, flush_logs
from iop_edge.runtime.systemd import Notifier

__all__ = ["NodeAgent"]


class NodeAgent:
    """One ``iop-node`` process: its options, logger, TLS context and sd_notify socket."""

    def __init__(
        self,
        options: NodeOptions,
        *,
        log: Logger,
        ssl: ssl.SSLContext | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.options = options
        self.log = log
        self.ssl = ssl
        self.notifier = notifier or Notifier()
        self.stopped = asyncio.Event()

    async def run(self) -> int:
        """Run until SIGTERM or SIGINT; return the exit code."""
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stopped.set)
        watchdog: asyncio.Task[None] | None = None
        try:
            self.log.info(
                "node_starting",
                edge=self.options.edge,
                ca_file=str(self.options.ca_file) if self.options.ca_file else None,
                drain_timeout=self.options.drain_timeout,
                agent_version=__version__,
                hostname=socket.gethostname(),
                pid=os.getpid(),
            )
            if self.notifier.watchdog_interval:
                watchdog = asyncio.create_task(self._watchdog(self.notifier.watchdog_interval))
            self.notifier.ready(f"dialing {self.options.edge}")
            await self.stopped.wait()
            self.notifier.stopping()
            self.log.info("node_stopped", exit_code=EXIT_DRAINED)
            return EXIT_DRAINED
        finally:
            if watchdog is not None:
                watchdog.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watchdog
            self.notifier.close()
            flush_logs()

    async def _watchdog(self, interval: float) -> None:
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(interval)
