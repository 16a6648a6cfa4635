"""sd_notify over ``$NOTIFY_SOCKET``: a few lines over a Unix datagram socket, no dependency.

The daemon sends ``READY=1`` once listening; ``RELOADING=1`` + ``MONOTONIC_USEC=…`` then
``READY=1`` around each refresh (which serves both ``Type=notify`` and ``Type=notify-reload``);
``STATUS=…`` with the running config hash and pending restarts, or the last rejection;
``WATCHDOG=1`` from the event loop when ``$WATCHDOG_USEC`` is set; ``STOPPING=1`` on drain.
Outside systemd (no ``$NOTIFY_SOCKET``) every call is a no-op.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping


class Notifier:
    """Sends sd_notify messages to the service manager, if there is one."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        # "@name" is an abstract socket: its address starts with a NUL byte.
        self._address = "\0" + address[1:] if address.startswith("@") else address
        self._socket: socket.socket | None = None
        watchdog = env.get("WATCHDOG_USEC", "")
        watchdog_pid = env.get("WATCHDOG_PID", "")
        mine = not watchdog_pid or watchdog_pid == str(os.getpid())
        self.watchdog_interval: float | None = (
            int(watchdog) / 1e6 / 2 if watchdog.isdigit() and int(watchdog) > 0 and mine else None
        )

    @property
    def enabled(self) -> bool:
        """True under a service manager that listens."""
        return bool(self._address)

    def notify(self, *fields: str) -> None:
        """Send one message made of ``KEY=value`` fields (newline-separated). Never raises:
        a failed notification must not take the daemon down."""
        if not self._address:
            return
        try:
            if self._socket is None:
                self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._socket.setblocking(False)
            self._socket.sendto("\n".join(fields).encode(), self._address)
        except OSError:
            pass

    def ready(self, status: str) -> None:
        """The daemon is serving."""
        self.notify("READY=1", f"STATUS={status}")

    def reloading(self) -> None:
        """A refresh starts (``MONOTONIC_USEC`` is required by ``Type=notify-reload``)."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.notify("RELOADING=1", f"MONOTONIC_USEC={usec}")

    def status(self, status: str) -> None:
        """Update the status line shown by ``systemctl status``."""
        self.notify(f"STATUS={status}")

    def watchdog(self) -> None:
        """The event loop is alive."""
        self.notify("WATCHDOG=1")

    def stopping(self, status: str = "draining") -> None:
        """The daemon stops accepting and drains."""
        self.notify("STOPPING=1", f"STATUS={status}")

    def close(self) -> None:
        """Close the socket."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None
