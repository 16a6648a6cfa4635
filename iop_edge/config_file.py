"""Reading the config file: the one way every command and the daemon get at ``edge.yaml``.

``serve`` (at start and on every refresh), ``config validate``, ``config show``, ``config
payload`` and ``config refresh --offline`` all read through :func:`read_config_file`, so they
agree on what a file holds and on every limit:

- only a **regular file** is read (a symlink to one is fine). A FIFO, a directory, a device or
  a socket is refused with a clear error, never opened for a blocking read: the file is opened
  with ``O_NONBLOCK`` and checked with ``fstat``, so a FIFO swapped in at the last moment cannot
  hang the reader either;
- at most :data:`MAX_FILE_BYTES` (4 MiB) are read;
- the bytes must be UTF-8 (``FILE: not valid UTF-8 at byte N``).

Then :func:`iop_edge.config.load_config` applies the limits of the text itself (nesting depth,
expanded size, integer range: :mod:`iop_edge.config.limits`). The daemon runs both steps in a
worker thread under :data:`LOAD_DEADLINE` (see :mod:`iop_edge.supervisor`).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from iop_edge.config import ConfigError, ConfigProblem, EdgeConfig, load_config

#: The largest config file read, in bytes (4 MiB: eight times the 200-node, 2,000-provider
#: benchmark config of 501 KiB).
MAX_FILE_BYTES: Final = 4 * 1024 * 1024
#: Seconds the daemon allows one read + load + classify of the config file before the refresh
#: is rejected (the largest file allowed loads in about 3 s on one core).
LOAD_DEADLINE: Final = 15.0

_KINDS: Final = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _cannot_read(path: str, why: str) -> ConfigError:
    return ConfigError([ConfigProblem("", f"cannot read config {path}: {why}")])


def _check_kind(path: str, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    raise _cannot_read(path, f"it is {kind}, not a regular file")


def _check_size(path: str, size: int) -> None:
    if size > MAX_FILE_BYTES:
        raise _cannot_read(
            path,
            f"it is {size:,} bytes; a config file may be at most {MAX_FILE_BYTES // 2**20} MiB "
            f"({MAX_FILE_BYTES:,} bytes)",
        )


def read_config_bytes(path: str) -> bytes:
    """The bytes of the config file at ``path``; raise :class:`ConfigError` (one line naming
    the file) when it is missing, unreadable, not a regular file or too large."""
    try:
        _check_kind(path, os.stat(path).st_mode)  # before opening: opening a device can act
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise _cannot_read(path, exc.strerror or str(exc)) from exc
    try:
        info = os.fstat(fd)  # the file actually opened (it may have been swapped meanwhile)
        _check_kind(path, info.st_mode)
        _check_size(path, info.st_size)
        chunks: list[bytes] = []
        total = 0
        while total <= MAX_FILE_BYTES:  # the file may grow while it is read
            chunk = os.read(fd, MAX_FILE_BYTES + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        _check_size(path, total)
        return b"".join(chunks)
    except OSError as exc:
        raise _cannot_read(path, exc.strerror or str(exc)) from exc
    finally:
        os.close(fd)


def decode_config(data: bytes, source: str) -> str:
    """The text of config bytes; raise :class:`ConfigError` at the first byte that is not
    UTF-8 (its offset from 0, its line, its value)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        at = exc.start
        line = data.count(b"\n", 0, at) + 1
        raise ConfigError(
            [
                ConfigProblem(
                    "",
                    f"{source}: not valid UTF-8 at byte {at} (line {line}, byte 0x{data[at]:02x});"
                    " save the file as UTF-8",
                )
            ]
        ) from None


def read_config_text(path: str) -> str:
    """The text of the config file at ``path`` (:func:`read_config_bytes`, then UTF-8)."""
    return decode_config(read_config_bytes(path), path)


def load_config_file(path: str, env: Mapping[str, str]) -> EdgeConfig:
    """Read and load the config file at ``path``; raise :class:`ConfigError` listing every
    problem (the reading problems above, then those of :func:`load_config`)."""
    return load_config(read_config_text(path), env=env, source=path)


@dataclass(frozen=True, slots=True)
class ConfigSnapshot:
    """What one read of the config file found: its bytes, or the problem that stopped it."""

    path: str
    data: bytes | None
    error: ConfigError | None

    @property
    def digest(self) -> str:
        """Identifies the content: equal digests mean nothing changed (a file that keeps
        failing to read the same way keeps the same digest)."""
        if self.data is not None:
            return hashlib.sha256(self.data).hexdigest()
        return f"unreadable: {self.error}"

    def text(self) -> str:
        """The text, or the :class:`ConfigError` that stopped the read or the decoding."""
        if self.data is None:
            assert self.error is not None
            raise self.error
        return decode_config(self.data, self.path)


def candidate_snapshot(source: str, data: bytes) -> ConfigSnapshot:
    """A candidate config handed over as bytes (the admin API's dry run of a file the daemon
    does not read), held to the file's size limit; ``source`` names it in errors."""
    try:
        _check_size(source, len(data))
    except ConfigError as exc:
        return ConfigSnapshot(source, None, exc)
    return ConfigSnapshot(source, data, None)


def snapshot_config_file(path: str) -> ConfigSnapshot:
    """Read the config file once; never raises (the problem is kept in the snapshot)."""
    try:
        return ConfigSnapshot(path, read_config_bytes(path), None)
    except ConfigError as exc:
        return ConfigSnapshot(path, None, exc)
