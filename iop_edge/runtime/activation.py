"""Listening sockets passed in by the process that started us (systemd socket activation).

The convention (``sd_listen_fds(3)``): ``LISTEN_PID`` is the pid the sockets are meant for,
``LISTEN_FDS`` how many there are, at file descriptors 3, 4, …; ``LISTEN_FDNAMES`` names them,
colon-separated. ``iop-edge serve`` takes its listeners' sockets that way when it is started
with them — by a ``iop-edge.socket`` unit, or by the running daemon handing over to a new
process — and binds the others itself. A socket is named after the listener it serves:
``openai``, ``metrics``, ``console`` or ``nodes`` (the node listener, ``listen.address``,
where remote ``iop-node`` agents dial in); a single unnamed socket is the ``openai`` one.

:func:`inherited_sockets` reads the environment (and unsets it, so the daemon's own children
do not inherit it); :func:`activation_argv` starts a program with given sockets at 3, 4, …,
through a small exec shim that sets ``LISTEN_PID`` to its own pid before ``exec`` (the pid
survives the ``exec``, and nothing else can know it before the fork).
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping, MutableMapping, Sequence

LISTENER_NAMES = ("openai", "metrics", "console", "nodes")
FIRST_FD = 3  # SD_LISTEN_FDS_START

_VARIABLES = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


class ActivationError(ValueError):
    """The passed sockets are not usable as the daemon's listeners; says which and why."""


def inherited_sockets(
    environ: MutableMapping[str, str] | None = None, pid: int | None = None
) -> dict[str, socket.socket]:
    """The listening sockets passed to this process, by listener name (empty: none passed).

    Sockets meant for another pid are ignored (the variables leaked from a parent). The
    variables are removed from ``environ`` either way.
    """
    env = os.environ if environ is None else environ
    values = {name: env.pop(name, None) for name in _VARIABLES}
    listen_pid, listen_fds = values["LISTEN_PID"], values["LISTEN_FDS"]
    listen_names = values["LISTEN_FDNAMES"]
    if listen_pid is None or listen_fds is None:
        return {}
    if listen_pid != str(os.getpid() if pid is None else pid):
        return {}
    if not listen_fds.isdigit() or int(listen_fds) < 1:
        raise ActivationError(f"LISTEN_FDS={listen_fds!r} is not a positive number of sockets")
    count = int(listen_fds)
    names = listen_names.split(":") if listen_names else []
    if not names and count == 1:
        names = ["openai"]
    if len(names) != count:
        raise ActivationError(
            f"LISTEN_FDNAMES={listen_names!r} names {len(names)} socket(s), LISTEN_FDS is "
            f"{count}; name each socket after its listener ({', '.join(LISTENER_NAMES)})"
        )
    sockets: dict[str, socket.socket] = {}
    for offset, name in enumerate(names):
        fd = FIRST_FD + offset
        if name not in LISTENER_NAMES:
            raise ActivationError(
                f"LISTEN_FDNAMES: socket {fd} is named {name!r}; the names are "
                f"{', '.join(LISTENER_NAMES)} (FileDescriptorName= in the socket unit)"
            )
        if name in sockets:
            raise ActivationError(f"LISTEN_FDNAMES: {name!r} is given twice")
        try:
            sock = socket.socket(fileno=fd)
        except OSError as exc:
            raise ActivationError(f"socket {fd} ({name}) cannot be used: {exc}") from None
        if sock.type != socket.SOCK_STREAM:
            raise ActivationError(f"socket {fd} ({name}) is not a stream socket")
        os.set_inheritable(fd, False)
        sockets[name] = sock
    return sockets


def activation_argv(argv: Sequence[str], names: Sequence[str]) -> list[str]:
    """The command that runs ``argv`` with the sockets it is given (see :func:`child_fds`) at
    3, 4, … named ``names``, and ``LISTEN_PID`` its own pid."""
    return [sys.executable, "-c", _SHIM, ":".join(names), *argv]


def child_fds(sockets: Sequence[socket.socket]) -> tuple[int, ...]:
    """The ``pass_fds`` of :func:`activation_argv`'s command: the sockets' descriptors, in
    order (the shim moves them to 3, 4, …)."""
    return tuple(sock.fileno() for sock in sockets)


# Runs in the child between fork and the real exec: move the passed descriptors (given in
# IOP_EDGE_ACTIVATION_FDS) to 3, 4, … (and a handover channel's out of their way) and set the
# variables with its own pid, then exec.
_SHIM = """\
import fcntl, os, sys
names = sys.argv[1]
fds = [int(fd) for fd in os.environ.pop("IOP_EDGE_ACTIVATION_FDS").split(",")]
high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in fds]
extra = os.environ.get("IOP_EDGE_HANDOVER_FD")
if extra:  # kept out of the way of 3, 4, ...: moved high, the variable updated
    moved = fcntl.fcntl(int(extra), fcntl.F_DUPFD, 64)
    os.set_inheritable(moved, True)
    os.close(int(extra))
    os.environ["IOP_EDGE_HANDOVER_FD"] = str(moved)
for fd in fds:
    os.close(fd)
for offset, fd in enumerate(high):
    os.dup2(fd, 3 + offset)
    os.close(fd)
os.environ.update(
    LISTEN_PID=str(os.getpid()), LISTEN_FDS=str(len(fds)), LISTEN_FDNAMES=names
)
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as exc:  # one line, and a shell's exit code for a command it cannot run
    sys.stderr.write(f"iop-edge: cannot run {sys.argv[2]!r}: {exc.strerror}\\n")
    sys.exit(127)
"""


def activation_env(
    sockets: Sequence[socket.socket | int], environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of :func:`activation_argv`'s command (``sockets``: sockets or their
    descriptors, in the order of the names)."""
    env = dict(os.environ if environ is None else environ)
    for name in _VARIABLES:
        env.pop(name, None)
    fds = [s if isinstance(s, int) else s.fileno() for s in sockets]
    env["IOP_EDGE_ACTIVATION_FDS"] = ",".join(str(fd) for fd in fds)
    return env
