"""Where a running daemon says its admin API is: one small file per config file.

``iop-edge serve`` writes ``console-<key>.json`` once its listeners are bound — the console's
actual address (a port 0 resolved), its pid and its config file — and removes it as it exits.
``iop-edge status``, ``restart`` and ``config refresh`` read it before they look at the config
file, so they find the daemon even when the file no longer loads, names another address (a
restart-class change still pending) or asked for port 0. ``<key>`` is derived from the config
file's real path, so two daemons on two config files never share a record.

The directory is the first of these that is usable:

1. ``$RUNTIME_DIRECTORY`` (systemd's ``RuntimeDirectory=iop-edge``: ``/run/iop-edge``);
2. ``$XDG_RUNTIME_DIR/iop-edge`` (a user's session);
3. ``/run/iop-edge`` (root);
4. ``$TMPDIR/iop-edge-<uid>`` (``/tmp`` by default), created with mode 0700.

The command line looks in all of them (root's shell may have an ``$XDG_RUNTIME_DIR`` of its
own while the service writes to ``/run/iop-edge``). Because the CLI sends the admin token to the
recorded address, a record is believed only where no other user could have put it: neither the
file nor its directory may be writable by group or others, and the directory must belong to
root or to this user, or sit in a root-owned directory that only root can write (``/run``).
A record whose process is gone (a crash) is ignored.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

RECORD_PREFIX: Final = "console-"
SYSTEM_DIRECTORY: Final = Path("/run/iop-edge")


def runtime_directories(env: Mapping[str, str]) -> list[Path]:
    """The directories a record may be in, in order of preference."""
    found: list[Path] = []
    if env.get("RUNTIME_DIRECTORY"):
        # systemd may list several (RuntimeDirectory=a b): the first is ours
        found.append(Path(env["RUNTIME_DIRECTORY"].split(":")[0]))
    if env.get("XDG_RUNTIME_DIR"):
        found.append(Path(env["XDG_RUNTIME_DIR"]) / "iop-edge")
    found.append(SYSTEM_DIRECTORY)
    found.append(Path(env.get("TMPDIR") or tempfile.gettempdir()) / f"iop-edge-{os.getuid()}")
    return list(dict.fromkeys(found))


def record_name(config_path: str | Path) -> str:
    """The record's file name for a config file: a hash of its real path."""
    real = os.path.realpath(config_path)
    return f"{RECORD_PREFIX}{hashlib.sha256(real.encode()).hexdigest()[:16]}.json"


@dataclass(frozen=True, slots=True)
class ConsoleRecord:
    """What a running daemon recorded: its admin API base URL, pid, config file (real path)
    and when it started serving (Unix time); ``path`` is where the record was found."""

    console: str
    pid: int
    config: str
    started_at: float
    path: Path


def _trusted_directory(directory: Path) -> bool:
    try:
        info = os.stat(directory)
        parent = os.stat(directory.parent)
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode) or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return False
    # A directory of the service's own (DynamicUser: an unnamed uid) is fine where only root
    # could have created it: in a root-owned parent nobody else can write to.
    root_only_parent = parent.st_uid == 0 and not parent.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    return info.st_uid in (0, os.getuid()) or root_only_parent


def _usable_directory(directory: Path) -> bool:
    """Create ``directory`` (0700 for a per-user one, else 0755) when missing; usable when we
    may write there and :func:`_trusted_directory` holds."""
    mode = 0o700 if directory.name.startswith("iop-edge-") else 0o755
    with contextlib.suppress(FileExistsError, OSError):
        directory.mkdir(mode=mode)
    return _trusted_directory(directory) and os.access(directory, os.W_OK | os.X_OK)


def write_record(config_path: Path, console_url: str, env: Mapping[str, str]) -> Path:
    """Record ``console_url`` for the daemon of ``config_path`` (this process) in the first
    usable runtime directory, atomically; returns the record's path. Raises :class:`OSError`
    when no directory is usable."""
    data = {
        "console": console_url,
        "pid": os.getpid(),
        "config": os.path.realpath(config_path),
        "started_at": time.time(),
    }
    tried = []
    for directory in runtime_directories(env):
        if not _usable_directory(directory):
            tried.append(str(directory))
            continue
        target = directory / record_name(config_path)
        partial = directory / f".{target.name}.{os.getpid()}"
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle)
        os.replace(partial, target)
        return target
    raise OSError(f"no usable runtime directory (tried {', '.join(tried)})")


def remove_record(path: Path) -> bool:
    """Remove the record at ``path`` if it is still this process's (after a handover the new
    process has written its own in its place); True when removed."""
    record = _read(path)
    if record is None or record.pid != os.getpid():
        return False
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


def _read(path: Path) -> ConsoleRecord | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        # (its directory is trusted: only its owner could have put it there)
        if not stat.S_ISREG(info.st_mode) or info.st_size > 64 * 1024:
            return None
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return None
        data = json.loads(os.read(fd, 64 * 1024))
        return ConsoleRecord(
            console=str(data["console"]),
            pid=int(data["pid"]),
            config=str(data["config"]),
            started_at=float(data["started_at"]),
            path=path,
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    finally:
        os.close(fd)


def find_record(config_path: str | Path, env: Mapping[str, str]) -> ConsoleRecord | None:
    """The record of the running daemon of ``config_path``, from a trusted directory, whose
    process is alive; ``None`` when there is none."""
    name = record_name(config_path)
    real = os.path.realpath(config_path)
    for directory in runtime_directories(env):
        if not _trusted_directory(directory):
            continue
        record = _read(directory / name)
        if record is not None and record.config == real and _alive(record.pid):
            return record
    return None


__all__ = [
    "ConsoleRecord",
    "find_record",
    "record_name",
    "remove_record",
    "runtime_directories",
    "write_record",
]
