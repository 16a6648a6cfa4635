"""A real ``redis-server`` for the tests and benches of the shared store (:class:`RedisServer`):
a subprocess listening on 127.0.0.1 at a free port and on a unix socket in a private directory,
with a password, saving nothing. It can be killed (``SIGKILL``, the store lost mid-run),
stopped, and started again on the same port and socket (the store back).

The binary is ``$IOP_EDGE_REDIS_SERVER`` if set, else ``redis-server`` on ``PATH``, else
``/usr/bin/redis-server`` or ``/usr/sbin/redis-server`` (Debian's package); Valkey's
``valkey-server`` works too through the variable. Without one, :class:`RedisServerNotFound`
says how to install it: ``make test`` does it on a fresh machine (``make redis``).

Readiness is the server's own word (its "Ready to accept connections" log line) followed by a
``PING`` on both addresses, bounded by :data:`~iop_edge.testing.leaks.BOUND`: no sleep stands
for a timing.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import cast

import redis

from iop_edge.testing.leaks import BOUND

__all__ = ["ENV_BINARY", "RedisServer", "RedisServerNotFound", "find_redis_server"]

#: the variable naming the server binary to use (a path)
ENV_BINARY = "IOP_EDGE_REDIS_SERVER"
#: where Debian's ``redis-server`` package puts it (not always on a user's ``PATH``)
_KNOWN_PATHS = ("/usr/bin/redis-server", "/usr/sbin/redis-server")
_READY = "Ready to accept connections"
_IN_USE = "Address already in use"
#: new free ports tried when the one found was taken before the server bound it
_PORT_ATTEMPTS = 5


class RedisServerNotFound(RuntimeError):
    """No ``redis-server`` binary was found; the message says how to get one."""


def find_redis_server() -> str:
    """The path of the ``redis-server`` to run (the module docstring's order)."""
    named = os.environ.get(ENV_BINARY)
    if named:
        if os.access(named, os.X_OK) and Path(named).is_file():
            return named
        raise RedisServerNotFound(
            f"${ENV_BINARY} is {named!r}, which is not an executable file; point it at a "
            "redis-server (or valkey-server) binary, or unset it to use the one on PATH"
        )
    found = shutil.which("redis-server")
    if found:
        return found
    for path in _KNOWN_PATHS:
        if os.access(path, os.X_OK):
            return path
    raise RedisServerNotFound(
        "redis-server was not found (not on PATH, not at /usr/bin/redis-server or "
        f"/usr/sbin/redis-server, ${ENV_BINARY} unset); the shared store's tests run a real "
        "one: install it with `sudo apt-get install -y redis-server` (Debian, Ubuntu) or "
        f"`make redis`, or set {ENV_BINARY} to the path of a redis-server binary"
    )


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return cast("Callable[..., int]", ctypes.CDLL(None, use_errno=True).prctl)
    except (OSError, AttributeError):
        return None


#: Linux's prctl(2), looked up before any fork (the child only calls it)
_PRCTL = _load_prctl()
_PR_SET_PDEATHSIG = 1


def _ends_with_parent() -> None:
    """In the child, before exec: ``SIGTERM`` it when the process that started it ends, even
    by ``SIGKILL`` or a ``timeout`` (no fixture's teardown runs then), so no server outlives
    its test run. Linux only; the thread that starts a server must outlive it (pytest's main
    thread does), as the signal follows that thread."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class RedisServer:
    """One ``redis-server`` subprocess (see the module docstring); a context manager that
    starts it and, on exit, stops it and removes its directory."""

    def __init__(self, *, password: str | None = None, binary: str | None = None) -> None:
        self.binary = binary or find_redis_server()
        self.password = password
        self.directory = Path(tempfile.mkdtemp(prefix="iop-redis-"))
        #: the unix socket's path (short: a socket path has at most 107 bytes)
        self.socket_path = self.directory / "redis.sock"
        self.port = 0
        self.process: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        #: every line the server wrote to its log (stdout), over all its runs
        self.lines: list[str] = []

    # -- addresses --------------------------------------------------------------------------

    @property
    def _auth(self) -> str:
        return f":{self.password}@" if self.password else ""

    @property
    def url(self) -> str:
        """``redis://[:password@]127.0.0.1:PORT/0``."""
        return f"redis://{self._auth}127.0.0.1:{self.port}/0"

    @property
    def unix_url(self) -> str:
        """``unix://[:password@]/DIR/redis.sock?db=0``."""
        return f"unix://{self._auth}{self.socket_path}?db=0"

    @property
    def output(self) -> str:
        """The server's log so far, as one text."""
        return "".join(self.lines)

    @property
    def running(self) -> bool:
        """Whether the subprocess is alive."""
        return self.process is not None and self.process.poll() is None

    # -- life -------------------------------------------------------------------------------

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        """Start the server: on a new free port the first time, on its port after that; return
        once it answers ``PING`` on both addresses."""
        if self.running:
            return
        if self.port:
            if not self._run(self.port):
                raise RuntimeError(
                    f"redis-server could not listen on 127.0.0.1:{self.port} again:\n" + self.output
                )
            return
        for _ in range(_PORT_ATTEMPTS):
            port = _free_port()
            if self._run(port):
                self.port = port
                return
        raise RuntimeError(
            f"redis-server found no free port in {_PORT_ATTEMPTS} attempts:\n{self.output}"
        )

    def _run(self, port: int) -> bool:
        """Run the server on ``port``: ``True`` once ready, ``False`` if the port was taken."""
        argv = [
            self.binary,
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--unixsocket", str(self.socket_path),
            "--unixsocketperm", "700",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.directory),
            "--daemonize", "no",
            "--logfile", "",
        ]  # fmt: skip
        if self.password:
            argv += ["--requirepass", self.password]
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=_ends_with_parent,
        )
        ready = threading.Event()
        first = len(self.lines)

        def drain() -> None:
            # (reads the log to its end, so the server never blocks on a full pipe)
            assert process.stdout is not None
            for line in process.stdout:
                self.lines.append(line)
                if _READY in line:
                    ready.set()
            ready.set()

        reader = threading.Thread(target=drain, name=f"redis-server-{port}", daemon=True)
        reader.start()
        if not ready.wait(BOUND):
            self._end(process, reader, signal.SIGKILL)
            raise RuntimeError(f"redis-server did not get ready within {BOUND:g} s:\n{self.output}")
        if process.poll() is not None:
            self._end(process, reader, signal.SIGKILL)
            if any(_IN_USE in line for line in self.lines[first:]):
                return False
            raise RuntimeError(
                f"redis-server exited with status {process.returncode}:\n{self.output}"
            )
        self.process = process
        self._reader = reader
        self.port = port
        for client in self._clients():
            with client:
                client.ping()
        return True

    def _clients(self) -> list[redis.Redis]:
        return [
            redis.Redis(
                host="127.0.0.1",
                port=self.port,
                password=self.password,
                socket_timeout=BOUND,
                socket_connect_timeout=BOUND,
            ),
            redis.Redis(
                unix_socket_path=str(self.socket_path),
                password=self.password,
                socket_timeout=BOUND,
                socket_connect_timeout=BOUND,
            ),
        ]

    def flushall(self) -> None:
        """Empty every database (between tests); starts the server again if it had ended."""
        self.start()
        with self._clients()[0] as client:
            client.flushall()

    def kill(self) -> None:
        """``SIGKILL`` the server, as a crash does, and reap it."""
        if self.process is not None and self._reader is not None:
            self._end(self.process, self._reader, signal.SIGKILL)
            self.process = None

    def stop(self) -> None:
        """Stop the server (``SIGTERM``; it exits at once, saving nothing)."""
        if self.process is not None and self._reader is not None:
            self._end(self.process, self._reader, signal.SIGTERM)
            self.process = None

    def restart(self) -> None:
        """Stop it if it runs, and start it again on the same port and socket (empty)."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop it and remove its directory."""
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    @staticmethod
    def _end(
        process: subprocess.Popen[str], reader: threading.Thread, signum: signal.Signals
    ) -> None:
        """End ``process`` with ``signum`` (``SIGKILL`` if that is not enough within the
        bound), reap it, and let its log reader reach the end of the log."""
        if process.poll() is None:
            process.send_signal(signum)
            try:
                process.wait(BOUND)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(BOUND)
        reader.join(BOUND)
        if process.stdout is not None and not reader.is_alive():
            process.stdout.close()
