"""Fixtures of the adapter tests: adapter sets closed after the test, and a FIFO the fake
agent writes its child's pid to (the builders they use are in ``tests/helpers/adapters.py``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from iop_edge.adapters import AdapterSet
from iop_edge.seams import Clock
from tests.helpers.adapters import build_set


@pytest.fixture
async def sets() -> AsyncIterator[Callable[..., AdapterSet]]:
    """Build AdapterSets that are closed (connections, process groups) after the test."""
    built: list[AdapterSet] = []

    def make(
        adapters: list[dict[str, Any]], providers: list[dict[str, Any]], clock: Clock | None = None
    ) -> AdapterSet:
        adapter_set = build_set(adapters, providers, clock)
        built.append(adapter_set)
        return adapter_set

    yield make
    for adapter_set in built:
        await adapter_set.aclose()


@pytest.fixture
def pid_fifo(tmp_path: Path) -> Iterator[Path]:
    """A FIFO for ``--pid-file``: the fake blocks on it until the test reads the pid, so the
    test knows the child exists before it acts."""
    path = tmp_path / "child.pid"
    os.mkfifo(path)
    yield path
    # After a failed test, unblock whichever side still waits on the FIFO (a reader thread of
    # read_pid_fifo, or a fake waiting to write), so nothing is left hanging.
    for flags in (os.O_WRONLY | os.O_NONBLOCK, os.O_RDONLY | os.O_NONBLOCK):
        with contextlib.suppress(OSError):
            fd = os.open(path, flags)
            if flags & os.O_WRONLY:
                os.write(fd, b"0\n")
            os.close(fd)
