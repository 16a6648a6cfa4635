"""Waiting on state and leak accounting, for tests and benches of a running edge.

- :func:`wait_for`: let the loop run until a predicate holds; the bound only ends a broken run.
- :func:`leaks` (scheduler slots and queue, releases, CLI process groups, child processes)
  and :func:`settled`, which waits for the edge to come to rest and asserts nothing leaked.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable

from iop_edge.daemon import Daemon
from iop_edge.pool import PoolStatistics

__all__ = [
    "BOUND",
    "NO_LEAKS",
    "child_pids",
    "children_of",
    "leaks",
    "process_gone",
    "settled",
    "wait_for",
]

BOUND = 20.0
"""Seconds any single wait may take before the run is declared broken (never a timing)."""


async def wait_for(
    predicate: Callable[[], bool | Awaitable[bool]], timeout: float = BOUND, *, poll: float = 0.002
) -> None:
    """Let the loop run until ``predicate()`` holds, polling every ``poll`` seconds; an async
    predicate (say, one asking the admin API) is awaited. The timeout only bounds a broken
    run: :class:`TimeoutError` after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while True:
            held = predicate()
            if not isinstance(held, bool):
                held = await held
            if held:
                return
            await asyncio.sleep(poll)


def children_of(pid: int) -> dict[int, str]:
    """The processes (zombies included) whose parent is ``pid``, with their command lines."""
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as handle:
                stat = handle.read()
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces, so split after the last ')'
        fields_after = stat.rpartition(")")[2].split()
        if len(fields_after) > 1 and fields_after[1] == str(pid):
            found[int(entry)] = cmdline
    return found


def child_pids() -> set[int]:
    """Processes (zombies included) whose parent is this process."""
    return set(children_of(os.getpid()))


def process_gone(pid: int) -> bool:
    """Whether no process ``pid`` exists any more (a zombie still exists)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def leaks(daemon: Daemon, *, processes: bool = True) -> dict[str, int]:
    """Everything that should be zero once the edge is at rest; any non-zero value is a leak.

    ``unreleased`` is ``admitted + inherited - released`` (a process started by a handover
    also releases the leases it inherited from the old one: at rest ``released == admitted +
    inherited``); ``unaccounted`` breaks the scheduler's identity ``submitted + failovers ==
    admitted + sum(rejected) + queue_depth``.
    """
    stats = daemon.scheduler.statistics()
    found = {
        "in_flight": stats.in_flight,
        "queue_depth": stats.queue_depth,
        "unreleased": stats.admitted + stats.inherited - stats.released,
        "double_releases": stats.double_releases,
        "unaccounted": stats.submitted
        + stats.failovers
        - stats.admitted
        - stats.rejected_total
        - stats.queue_depth,
        "cli_runs": sum(
            a.live_process_groups + a.kills_pending for a in daemon.adapters.statistics()
        ),
    }
    if processes:
        found["child_processes"] = len(child_pids())
    return found


NO_LEAKS = {
    "in_flight": 0,
    "queue_depth": 0,
    "unreleased": 0,
    "double_releases": 0,
    "unaccounted": 0,
    "cli_runs": 0,
    "child_processes": 0,
}


async def settled(daemon: Daemon, *, processes: bool = True) -> PoolStatistics:
    """Wait until the edge is at rest (no slot held, nothing queued, no CLI group alive), then
    assert that nothing leaked and return the scheduler's statistics."""
    expected = NO_LEAKS if processes else {k: 0 for k in NO_LEAKS if k != "child_processes"}
    with contextlib.suppress(TimeoutError):
        await wait_for(lambda: leaks(daemon, processes=processes) == expected)
    assert leaks(daemon, processes=processes) == expected
    return daemon.scheduler.statistics()
