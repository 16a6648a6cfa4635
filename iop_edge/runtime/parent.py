"""The thin parent of ``iop-edge serve`` outside systemd (issue 25).

Under systemd the service manager reaps the daemon's orphans and learns the new main process of
a handover from ``MAINPID=``. Elsewhere — a container's entrypoint (PID 1), a foreground run in
a shell, ``make run`` — the process the operator started used to be the server itself, and so:
as PID 1 it reaped nothing (each CLI agent's background job became a zombie); and a handover
ended it, which ends a container (a restart there was refused) and hands a shell its prompt
back while the gateway runs on out of its reach.

So there, the process started stays a thin parent across handovers. It starts the real server
as its child — the same command, with ``NOTIFY_SOCKET`` naming a datagram socket of its own —
and:

- reaps every child: it is PID 1, or it makes itself the child subreaper
  (``prctl(PR_SET_CHILD_SUBREAPER)``), so orphans below it come to it — a CLI's background
  jobs, and the successor of a handover once the old server exits;
- forwards SIGTERM and SIGINT to every server it knows (a draining old one too), SIGHUP and
  SIGUSR2 to the current one once it said ``READY=1`` (before: a SIGHUP is held for it and
  sent on ``READY=1``, a SIGUSR2 is logged and ignored, as the server does while it starts);
- learns which server is current from the sd_notify messages every server sends anyway:
  ``READY=1``; ``MAINPID=<pid>`` from the old server at a handover; ``STOPPING=1``. Only the
  current server is believed (each datagram carries its sender's pid, checked by the kernel);
- exits, once no server runs, with the current server's exit status (128 + N when signal N
  ended it).

Not on other systems (no subreaper; ``serve`` runs the server in the process started), not
with ``NOTIFY_SOCKET`` set (systemd does all this), not with ``--no-parent``.

:mod:`iop_edge.cli` imports this module before anything else, and the parent runs from that
import (it never returns: the process exits with the server's status). So it is stdlib only,
handles the signals from its first instant, and stays a few megabytes: no asyncio, no threads.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from typing import TYPE_CHECKING

# (light; importing it in `serve` puts its remembering handlers in, which catch_signals then
# replaces with the parent's own)
from iop_edge.runtime.signals import RESTART_SIGNAL_WHILE_STARTING

if TYPE_CHECKING:  # (not loaded at run time: the parent stays light)
    from collections.abc import Mapping, Sequence
    from types import FrameType
    from typing import Any, Final

NO_PARENT: Final = "--no-parent"
"""The ``serve`` option that runs the server in the process started, without a parent."""

FORWARDED: Final = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2)
"""The signals the parent passes on to the server."""

_PR_SET_CHILD_SUBREAPER: Final = 36  # <linux/prctl.h>
_CREDENTIALS_SIZE: Final = 12  # struct ucred: pid, uid, gid


def wanted(argv: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Whether this process is ``iop-edge serve`` that should run as the thin parent."""
    return (
        sys.platform == "linux"
        and list(argv[1:2]) == ["serve"]
        and "NOTIFY_SOCKET" not in environ
        and NO_PARENT not in argv[2:]
    )


def server_command() -> list[str]:
    """The command that started this process, run again for the server: the interpreter with
    its own options and arguments (``python -m iop_edge``, the console script's path)."""
    return [sys.executable, *sys.orig_argv[1:]]


def exit_code(status: int) -> int:
    """A ``waitpid`` status as a shell shows it: the exit code, or 128 + N for signal N."""
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def log(level: str, event: str, **fields: Any) -> None:
    """One JSON line on stderr, shaped like the server's (``component`` says who wrote it)."""
    import json  # (only when there is something to say)

    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"
    line = {"component": "parent", "pid": os.getpid(), **fields}
    line |= {"event": event, "level": level, "timestamp": stamp}
    os.write(2, json.dumps(line, separators=(",", ":")).encode() + b"\n")


def _wake(signum: int, frame: FrameType | None) -> None:
    """The handler of every signal the parent takes: nothing — the interpreter has already
    written the signal's number to the wakeup pipe the main loop reads."""


def catch_signals() -> int:
    """Route :data:`FORWARDED` and SIGCHLD to a pipe; returns its reading end."""
    readable, writable = os.pipe()
    os.set_blocking(readable, False)
    os.set_blocking(writable, False)
    signal.set_wakeup_fd(writable, warn_on_full_buffer=False)
    for signum in (*FORWARDED, signal.SIGCHLD):
        signal.signal(signum, _wake)
    return readable


class ThinParent:
    """The parent's state: the servers it knows, which one is current, what it said."""

    def __init__(self, wake: int) -> None:
        import socket  # (after the signals are caught: see catch_signals)

        self._wake = wake
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        # An abstract address (no file to clean up); the kernel tells each sender's pid.
        name = f"iop-edge-parent/{os.getpid()}/{os.urandom(8).hex()}"
        self._socket.bind("\0" + name)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self._socket.setblocking(False)
        self.notify_socket = "@" + name
        self.current = 0
        #: the servers still running: the first, and every one named by MAINPID=
        self.servers: set[int] = set()
        self.code: int | None = None
        #: what the current server said
        self.ready = False
        self.stopping = False
        self._held_hup = False

    def start(self, command: Sequence[str], environ: Mapping[str, str]) -> None:
        """Start the server. Listening sockets passed to this process (socket activation:
        ``LISTEN_PID`` is ours) are passed on to it, and closed here."""
        env = {**environ, "NOTIFY_SOCKET": self.notify_socket}
        count = env.get("LISTEN_FDS", "")
        ours = env.get("LISTEN_PID") == str(os.getpid()) and count.isdigit()
        passed = int(count) if ours else 0
        pid = os.fork()
        if pid == 0:  # the child, until exec: nothing but what it must do
            try:
                signal.set_wakeup_fd(-1)  # (a signal now is the child's, not the parent's)
                # (the interpreter ignores these two; the server starts with the default, as
                # a subprocess does)
                signal.signal(signal.SIGPIPE, signal.SIG_DFL)
                signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
                if passed:
                    env["LISTEN_PID"] = str(os.getpid())
                os.execve(command[0], list(command), env)
            except BaseException as exc:  # (never back into the parent's code)
                os.write(2, f"iop-edge: cannot run {command[0]!r}: {exc}\n".encode())
            finally:
                os._exit(127)
        for fd in range(3, 3 + passed):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.current = pid
        self.servers.add(pid)

    def run(self) -> int:
        """Serve the servers until none runs; the current one's exit code."""
        import select

        while self.code is None or self.servers:
            select.select([self._socket.fileno(), self._wake], [], [])
            for signum in self._signals():
                self._on_signal(signum)
            reaped, children_left = self._reap()
            # (after reaping: a MAINPID= sent before an exit just seen is read first)
            self._read_messages()
            for pid, code in reaped.items():
                if pid in self.servers:
                    self.servers.discard(pid)
                    if pid == self.current:
                        self._current_exited(code)
            if not children_left and self.code is None:
                # Not a subreaper: the server that took over went to init, out of reach.
                log(
                    "warning",
                    "server_out_of_reach",
                    server=self.current,
                    message="the server that took over is not a child of this process; the "
                    "parent exits and leaves it running",
                )
                self.code = 0
                self.servers.clear()
        self._socket.close()
        return self.code

    def _signals(self) -> list[int]:
        received = b""
        while True:
            try:
                chunk = os.read(self._wake, 512)
            except BlockingIOError:
                return list(received)
            if not chunk:
                return list(received)
            received += chunk

    def _on_signal(self, signum: int) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            for pid in self.servers:
                _kill(pid, signum)
        elif signum == signal.SIGHUP:
            if self.ready:
                _kill(self.current, signum)
            else:
                self._held_hup = True
        elif signum == signal.SIGUSR2:
            if self.ready:
                _kill(self.current, signum)
            else:
                log(
                    "warning",
                    "restart_signal_ignored",
                    signal="SIGUSR2",
                    phase="starting",
                    message=RESTART_SIGNAL_WHILE_STARTING,
                )

    def _reap(self) -> tuple[dict[int, int], bool]:
        """Every child that ended (servers and orphans alike): pid → exit code; and whether
        any child is left."""
        reaped: dict[int, int] = {}
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return reaped, False
            if pid == 0:
                return reaped, True
            reaped[pid] = exit_code(status)

    def _read_messages(self) -> None:
        import socket
        import struct

        space = socket.CMSG_SPACE(_CREDENTIALS_SIZE)
        while True:
            try:
                data, ancillary, _, _ = self._socket.recvmsg(4096, space)
            except BlockingIOError:
                return
            sender = 0
            for level, kind, value in ancillary:
                if (level, kind) == (socket.SOL_SOCKET, socket.SCM_CREDENTIALS):
                    sender = struct.unpack("i", value[:4])[0]
            if sender == self.current:  # no one else speaks for the server
                self._on_message(data.decode("utf-8", errors="replace"))

    def _on_message(self, text: str) -> None:
        for line in text.splitlines():
            key, _, value = line.partition("=")
            if line == "READY=1":
                self.ready = True
                if self._held_hup:
                    self._held_hup = False
                    _kill(self.current, signal.SIGHUP)
            elif line == "STOPPING=1":
                self.stopping = True
            elif key == "MAINPID" and value.isdigit() and int(value) != self.current:
                # A handover: the new server is ready and serving; the old one drains.
                self.current = int(value)
                self.servers.add(self.current)
                self.ready = True
                self.stopping = False

    def _current_exited(self, code: int) -> None:
        self.code = code
        if code > 128:
            name = signal.Signals(code - 128).name if code - 128 in _SIGNAL_NUMBERS else "?"
            log(
                "error",
                "server_killed",
                server=self.current,
                exit_code=code,
                message=f"the server was killed by {name}; the parent exits with {code}",
            )
        elif code and self.ready and not self.stopping:
            log(
                "error",
                "server_exited",
                server=self.current,
                exit_code=code,
                message=f"the server exited with status {code} while it served",
            )


_SIGNAL_NUMBERS: Final = frozenset(int(s) for s in signal.Signals)


def _kill(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it has just exited: the reaping sees it
        os.kill(pid, signum)


def _become_subreaper() -> bool:
    """Make orphans below this process its children (Linux 3.4+); whether that worked."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0


def main() -> int:
    """Run as the thin parent of a server started with this process's own command; returns
    the exit code (see the module docstring)."""
    wake = catch_signals()  # first: from here no signal it forwards can end it
    if os.getpid() != 1 and not _become_subreaper():
        log(
            "warning",
            "not_a_subreaper",
            message="prctl(PR_SET_CHILD_SUBREAPER) failed: orphans of the server go to init, "
            "and the server that takes over at a restart is not watched",
        )
    parent = ThinParent(wake)
    command = server_command()
    parent.start(command, os.environ)
    code = parent.run()
    for signum in FORWARDED:  # (exiting: Python would give them their default action back)
        signal.signal(signum, signal.SIG_IGN)
    return code


if wanted(sys.argv, os.environ):
    raise SystemExit(main())
