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

The files a config refers to are read with the same care, again at every load: a
``${file:/path}`` reference (:func:`read_secret_file`, at most 64 KiB) and the env file of
``serve --env-file`` (:class:`ServiceEnvironment`, at most 1 MiB).

Then :func:`iop_edge.config.load_config` applies the limits of the text itself (nesting depth,
expanded size, integer range: :mod:`iop_edge.config.limits`). The daemon runs both steps in a
worker thread under :data:`LOAD_DEADLINE` (see :mod:`iop_edge.supervisor`).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from iop_edge.config import ConfigError, ConfigProblem, EdgeConfig, load_config
from iop_edge.config.load import UnreadableFile
from iop_edge.env_file import parse_env_text

#: The largest config file read, in bytes (4 MiB: eight times the 200-node, 2,000-provider
#: benchmark config of 501 KiB).
MAX_FILE_BYTES: Final = 4 * 1024 * 1024
#: The largest file a ``${file:/path}`` reference reads (a key, a token, a certificate).
MAX_SECRET_FILE_BYTES: Final = 64 * 1024
#: The largest env file read (``serve --env-file``).
MAX_ENV_FILE_BYTES: Final = 1024 * 1024
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


class _Unreadable(Exception):
    """Why a file cannot be read (a sentence without the file's name)."""


def _check_kind(mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    raise _Unreadable(f"it is {kind}, not a regular file")


def _check_size(size: int, limit: int, what: str) -> None:
    if size > limit:
        bound = f"{limit // 2**20} MiB" if limit >= 2**20 else f"{limit // 2**10} KiB"
        raise _Unreadable(f"it is {size:,} bytes; {what} may be at most {bound} ({limit:,} bytes)")


def _read_regular_file(path: str, limit: int, what: str) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them (``what`` names
    the kind of file in the message); :class:`_Unreadable` otherwise. Never blocks on a FIFO
    or a device (module docstring)."""
    try:
        _check_kind(os.stat(path).st_mode)  # before opening: opening a device can act
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise _Unreadable(exc.strerror or str(exc)) from exc
    try:
        info = os.fstat(fd)  # the file actually opened (it may have been swapped meanwhile)
        _check_kind(info.st_mode)
        _check_size(info.st_size, limit, what)
        chunks: list[bytes] = []
        total = 0
        while total <= limit:  # the file may grow while it is read
            chunk = os.read(fd, limit + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        _check_size(total, limit, what)
        return b"".join(chunks)
    except OSError as exc:
        raise _Unreadable(exc.strerror or str(exc)) from exc
    finally:
        os.close(fd)


def _cannot_read(path: str, why: str) -> ConfigError:
    return ConfigError([ConfigProblem("", f"cannot read config {path}: {why}")])


def read_config_bytes(path: str) -> bytes:
    """The bytes of the config file at ``path``; raise :class:`ConfigError` (one line naming
    the file) when it is missing, unreadable, not a regular file or too large."""
    try:
        return _read_regular_file(path, MAX_FILE_BYTES, "a config file")
    except _Unreadable as exc:
        raise _cannot_read(path, str(exc)) from exc


def _utf8_error(data: bytes, exc: UnicodeDecodeError) -> str:
    at = exc.start
    line = data.count(b"\n", 0, at) + 1
    return f"not valid UTF-8 at byte {at} (line {line}, byte 0x{data[at]:02x})"


def decode_config(data: bytes, source: str) -> str:
    """The text of config bytes; raise :class:`ConfigError` at the first byte that is not
    UTF-8 (its offset from 0, its line, its value)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        message = f"{source}: {_utf8_error(data, exc)}; save the file as UTF-8"
        raise ConfigError([ConfigProblem("", message)]) from None


def read_config_text(path: str) -> str:
    """The text of the config file at ``path`` (:func:`read_config_bytes`, then UTF-8)."""
    return decode_config(read_config_bytes(path), path)


def read_secret_file(path: str) -> str:
    """The text of a ``${file:/path}`` reference (the loader's file reader): a regular file
    of at most :data:`MAX_SECRET_FILE_BYTES`, UTF-8, trailing line breaks dropped (``echo KEY
    > FILE`` and Docker and Kubernetes secrets end with one). Read again at every load, so a
    rotated file takes effect at the next start, refresh or handover. Raises
    :class:`~iop_edge.config.load.UnreadableFile` saying why."""
    try:
        data = _read_regular_file(path, MAX_SECRET_FILE_BYTES, "a file read by ${file:}")
    except _Unreadable as exc:
        raise UnreadableFile(str(exc)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableFile(_utf8_error(data, exc)) from None
    return text.rstrip("\r\n")


def read_env_file(path: str) -> dict[str, str]:
    """The variables of the env file at ``path`` (:mod:`iop_edge.env_file`), read with the
    care of the config file (a regular file, at most :data:`MAX_ENV_FILE_BYTES`, UTF-8);
    :class:`ConfigError` naming the file (and the line) otherwise."""
    try:
        data = _read_regular_file(path, MAX_ENV_FILE_BYTES, "an env file")
    except _Unreadable as exc:
        raise ConfigError([ConfigProblem("", f"cannot read env file {path}: {exc}")]) from None
    return parse_env_text(decode_config(data, path), path)


class ServiceEnvironment(Mapping[str, str]):
    """The daemon's environment: as a mapping, the process's own (what a process started by
    a handover inherits); for ``${VAR}``, :meth:`variables` — the values of the env file
    (``serve --env-file``) over it, the file read again at every call.

    The env file's values are never put in a child's environment: the new process of a
    handover runs the same command line and reads the file itself, so a variable removed from
    the file is gone, not inherited.
    """

    def __init__(self, inherited: Mapping[str, str], env_file: str | None = None) -> None:
        self._inherited = dict(inherited)
        self.env_file = env_file

    def __getitem__(self, name: str) -> str:
        return self._inherited[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._inherited)

    def __len__(self) -> int:
        return len(self._inherited)

    def variables(self) -> Mapping[str, str]:
        """The variables ``${VAR}`` expands from now; :class:`ConfigError` (naming the env file
        and line) when the env file cannot be read or parsed."""
        if self.env_file is None:
            return self._inherited
        return {**self._inherited, **read_env_file(self.env_file)}


def variables(env: Mapping[str, str]) -> Mapping[str, str]:
    """What ``${VAR}`` expands from: ``env`` itself, or a :class:`ServiceEnvironment`'s
    variables (its env file read now)."""
    return env.variables() if isinstance(env, ServiceEnvironment) else env


def load_config_file(path: str, env: Mapping[str, str]) -> EdgeConfig:
    """Read and load the config file at ``path``, its references resolved from ``env`` (a
    :class:`ServiceEnvironment` re-reads its env file) and from files
    (:func:`read_secret_file`); raise :class:`ConfigError` listing every problem (the reading
    problems above, then those of :func:`load_config`)."""
    text = read_config_text(path)
    return load_config(text, env=variables(env), read_file=read_secret_file, source=path)


Trigger = Literal["file", "signal", "api"]
"""What asked for a refresh: a change of the file, SIGHUP, or the admin API (or the CLI)."""


@dataclass(frozen=True, slots=True)
class ConfigSnapshot:
    """What one read of the config file found: its bytes, or the problem that stopped it; what
    asked for the read; and its :attr:`digest`, computed once, when the snapshot is made."""

    path: str
    data: bytes | None
    error: ConfigError | None
    trigger: Trigger = "file"
    digest: str = field(init=False, repr=False, compare=False)
    """Identifies the content: equal digests mean nothing changed (a file that keeps failing to
    read the same way keeps the same digest)."""

    def __post_init__(self) -> None:
        # Computed once: the watch compares it to what was judged last, the refresh path
        # records it, and a 4 MiB file costs milliseconds to hash.
        digest = (
            hashlib.sha256(self.data).hexdigest()
            if self.data is not None
            else f"unreadable: {self.error}"
        )
        object.__setattr__(self, "digest", digest)

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
        _check_size(len(data), MAX_FILE_BYTES, "a config file")
    except _Unreadable as exc:
        return ConfigSnapshot(source, None, _cannot_read(source, str(exc)), "api")
    return ConfigSnapshot(source, data, None, "api")


def snapshot_config_file(path: str, trigger: Trigger = "file") -> ConfigSnapshot:
    """Read the config file once (for ``trigger``); never raises (the problem is kept in the
    snapshot)."""
    try:
        return ConfigSnapshot(path, read_config_bytes(path), None, trigger)
    except ConfigError as exc:
        return ConfigSnapshot(path, None, exc, trigger)
