"""Watching the config file: which changes in its directory count, and when a write is over.

The supervisor watches the config file's **directory** (an editor's rename-save, ``sed -i``, a
delete + recreate or a Kubernetes ``..data`` symlink swap may never touch the file itself), but
reacts only to the names in it that can change what the config path resolves to
(:func:`watched_names`): the file's own name, every symlink of its chain that lives in that
directory, and ``..data`` when there is one. A log file written beside the config triggers no
read. The names are computed again after every create, delete or rename of one of them (a swap
changes the chain).

On Linux the directory is watched with **inotify** (over ctypes, :class:`ConfigWatch`), which
also says when a writer **closes** a file (``IN_CLOSE_WRITE``). A file modified in place
(``IN_MODIFY``) is then taken as being written until its writer closes it: :attr:`ConfigWatch.
closed` is clear meanwhile, and the supervisor judges nothing, and runs no settle timer, before
the close (at most ``settle_limit`` seconds: a file still open for writing then is rejected
unread). After the close, and at once after a rename into place (``IN_MOVED_TO``) or a symlink
swap, the supervisor's settle window applies as before. So an in-place save written in parts
by one writer, however far apart its parts, is never judged half-written.

What remains: a save written by **two opens** (write, close, reopen, write the rest) whose
second part comes more than the settle window after the close is judged between its parts,
as is the file of a writer that keeps it open past ``settle_limit``; inotify cannot tell that
a writer means to come back. A writer that closes the file while another still writes it ends
the wait early (inotify counts no writers). Files the chain reaches outside the directory (a
symlink to ``/srv/...``) are not watched in place: the periodic content check finds their
changes.

Elsewhere (no inotify, or no inotify instance left: ``fs.inotify.max_user_instances``) the
directory is watched with watchfiles, filtered by the same names; it reports no close, so
there the settle window alone decides (:attr:`ConfigWatch.closed` stays set).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import watchfiles

__all__ = ["ConfigWatch", "InotifyUnavailable", "WatchStatistics", "watched_names"]

# <sys/inotify.h>
IN_MODIFY: Final = 0x00000002
IN_ATTRIB: Final = 0x00000004
IN_CLOSE_WRITE: Final = 0x00000008
IN_MOVED_FROM: Final = 0x00000040
IN_MOVED_TO: Final = 0x00000080
IN_CREATE: Final = 0x00000100
IN_DELETE: Final = 0x00000200
IN_DELETE_SELF: Final = 0x00000400
IN_MOVE_SELF: Final = 0x00000800
IN_UNMOUNT: Final = 0x00002000
IN_Q_OVERFLOW: Final = 0x00004000
IN_IGNORED: Final = 0x00008000
IN_ONLYDIR: Final = 0x01000000
#: No events for a child once it is unlinked (a writer of a deleted file no longer matters).
IN_EXCL_UNLINK: Final = 0x04000000
IN_NONBLOCK: Final = os.O_NONBLOCK
IN_CLOEXEC: Final = os.O_CLOEXEC

#: What the directory is watched for.
WATCH_MASK: Final = (
    IN_CLOSE_WRITE
    | IN_MODIFY
    | IN_MOVED_TO
    | IN_MOVED_FROM
    | IN_CREATE
    | IN_DELETE
    | IN_ATTRIB
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
    | IN_EXCL_UNLINK
)
#: A name's entry changed: what the config path resolves to may have too.
_SWAPPED: Final = IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM
#: The watch itself is gone (the directory was deleted, moved or unmounted).
_LOST: Final = IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT | IN_IGNORED

#: ``struct inotify_event`` without its name: wd, mask, cookie, len.
_EVENT: Final = struct.Struct("iIII")
_READ_SIZE: Final = 64 * 1024  # room for hundreds of events; one is at most 16 + 256 bytes
_MAX_SYMLINKS: Final = 40  # the kernel's own bound (ELOOP)


class InotifyUnavailable(OSError):
    """inotify cannot be used here (not Linux, or no instance left): watch with watchfiles."""


def watched_names(path: Path) -> frozenset[str]:
    """The names in ``path``'s directory whose change can change what ``path`` resolves to:
    its own name, each symlink of its chain that lives in that directory (``edge.yaml ->
    ..data/edge.yaml``, ``..data -> ..2026_11_30_a``) and the directories the chain passes
    through there, and ``..data`` when it exists. The chain is followed as the kernel does,
    one component at a time (relative targets from the link's own directory, ``..``
    physically), for at most 40 links."""
    home = os.path.realpath(path.parent)
    names = {path.name}
    if os.path.lexists(os.path.join(home, "..data")):
        names.add("..data")
    pending = [path.name]
    where = home
    links = 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            where = os.path.dirname(where)
            continue
        if where == home:
            names.add(part)
        candidate = os.path.join(where, part)
        try:
            target = os.readlink(candidate)
        except OSError:  # not a symlink (or not there): go on below it
            where = candidate
            continue
        links += 1
        if links > _MAX_SYMLINKS:
            break
        if target.startswith("/"):
            where = "/"
        pending[:0] = target.split("/")
    return frozenset(names)


@dataclass(frozen=True, slots=True)
class WatchStatistics:
    """A read-only view of the config watch."""

    backend: str
    """``inotify``, ``watchfiles``, or ``""`` before the watch is up."""
    names: tuple[str, ...]
    """The names in the directory that count (:func:`watched_names`), sorted."""
    events: int
    """Events on those names (each asks for a refresh)."""
    ignored: int
    """Events on other names in the directory (none asks for anything)."""
    open_for_writing: tuple[str, ...]
    """Names modified in place whose writer has not closed them yet (inotify only)."""


def _libc_inotify() -> tuple[Callable[..., int], Callable[..., int]]:
    if not sys.platform.startswith("linux"):
        raise InotifyUnavailable(f"inotify is Linux only (this is {sys.platform})")
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        init1, add_watch = libc.inotify_init1, libc.inotify_add_watch
    except (OSError, AttributeError) as exc:
        raise InotifyUnavailable(f"the C library has no inotify: {exc}") from exc
    init1.argtypes, init1.restype = [ctypes.c_int], ctypes.c_int
    add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    add_watch.restype = ctypes.c_int
    return init1, add_watch


class ConfigWatch:
    """Watches the directory of the config file at ``path``: ``on_change()`` is called for
    every event on one of :func:`watched_names` (the supervisor then reads, settles, judges),
    none for the other names; :attr:`closed` is clear while a watched name is open for writing
    after an in-place change (module docstring). Run :meth:`run_inotify` (or, where it raises
    :class:`InotifyUnavailable`, :meth:`run_watchfiles`) in a task; cancel it to stop."""

    def __init__(self, path: Path, on_change: Callable[[], None]) -> None:
        self.path = path
        self._on_change = on_change
        self._names = watched_names(path)
        self._open: set[str] = set()
        #: set while no watched name is open for writing after an in-place change
        self.closed = asyncio.Event()
        self.closed.set()
        self._backend = ""
        self._events = 0
        self._ignored = 0

    def statistics(self) -> WatchStatistics:
        """The watch as of now."""
        return WatchStatistics(
            backend=self._backend,
            names=tuple(sorted(self._names)),
            events=self._events,
            ignored=self._ignored,
            open_for_writing=tuple(sorted(self._open)),
        )

    # -- what an event means -------------------------------------------------------------

    def event(self, name: str, mask: int) -> None:
        """One inotify event on ``name`` in the directory (``mask``: what happened)."""
        if name not in self._names:
            self._ignored += 1
            return
        self._events += 1
        if mask & _SWAPPED:
            # Another file is at the name now: whoever wrote the old one no longer writes
            # the config, and the chain may lead elsewhere.
            self._open.discard(name)
            self._names = watched_names(self.path)
            self._open &= self._names
        elif mask & IN_MODIFY:
            self._open.add(name)
        elif mask & IN_CLOSE_WRITE:
            self._open.discard(name)
        if self._open:
            self.closed.clear()
        else:
            self.closed.set()
        self._on_change()

    def forget_writers(self) -> None:
        """Events were lost (a queue overflow, a new watch): assume no writer is left, and
        compute the names again."""
        self._open.clear()
        self.closed.set()
        self._names = watched_names(self.path)

    # -- inotify -------------------------------------------------------------------------

    async def run_inotify(self) -> None:
        """Watch with inotify until cancelled, or until the directory itself goes away
        (deleted, moved, unmounted): then return (the caller watches again, once the
        directory is back). Raises :class:`InotifyUnavailable` when inotify cannot be used,
        :class:`OSError` when the directory cannot be watched."""
        init1, add_watch = _libc_inotify()
        fd = init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            errno = ctypes.get_errno()
            raise InotifyUnavailable(errno, f"inotify_init1: {os.strerror(errno)}")
        loop = asyncio.get_running_loop()
        lost: asyncio.Future[None] = loop.create_future()
        try:
            directory = os.fsencode(self.path.parent)
            if add_watch(fd, directory, WATCH_MASK) < 0:
                errno = ctypes.get_errno()
                raise OSError(errno, os.strerror(errno), str(self.path.parent))
            loop.add_reader(fd, self._readable, fd, lost)
            try:
                self._backend = "inotify"
                self.forget_writers()
                self._on_change()  # the watch is up: look once for a change made before it
                await lost
            finally:
                loop.remove_reader(fd)
        finally:
            os.close(fd)

    def _readable(self, fd: int, lost: asyncio.Future[None]) -> None:
        try:
            data = os.read(fd, _READ_SIZE)
        except BlockingIOError:
            return
        except OSError as exc:
            if not lost.done():
                lost.set_exception(exc)
            return
        offset = 0
        while offset + _EVENT.size <= len(data):
            _, mask, _, size = _EVENT.unpack_from(data, offset)
            start = offset + _EVENT.size
            offset = start + size
            if mask & IN_Q_OVERFLOW:  # events were dropped: judge the file anew
                self.forget_writers()
                self._on_change()
            elif mask & _LOST:
                if not lost.done():
                    lost.set_result(None)
            elif size:
                name = os.fsdecode(data[start:offset].split(b"\0", 1)[0])
                self.event(name, mask)

    # -- watchfiles (no inotify) -----------------------------------------------------------

    async def run_watchfiles(self, *, debounce: float, stop: asyncio.Event) -> None:
        """Watch with watchfiles until ``stop`` is set (or the task is cancelled). It reports
        no close, so :attr:`closed` stays set; events are debounced by ``debounce`` s."""
        self._backend = "watchfiles"
        first = True
        async for changes in watchfiles.awatch(
            self.path.parent,
            debounce=int(debounce * 1000),
            step=50,
            stop_event=stop,
            recursive=False,
            ignore_permission_denied=True,
            yield_on_timeout=True,
            rust_timeout=1000,
        ):
            names = self._names
            relevant = [c for c in changes if os.path.basename(c[1]) in names]
            self._ignored += len(changes) - len(relevant)
            self._events += len(relevant)
            if relevant:
                self._names = watched_names(self.path)
            # The first (timeout) round means the watch is up: look once for a change made
            # before it.
            if relevant or first:
                self._on_change()
            first = False
