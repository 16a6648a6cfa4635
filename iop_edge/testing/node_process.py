"""``iop-node`` as a subprocess (:class:`NodeProcess`), run as an operator runs it, and what an
operator reads back: its log events and its exit status. The node tests
(``tests/node/test_program.py``) and the end-to-end tests of remote nodes run it this way.

The environment it gets is the test's without any ``IOP_NODE_*`` or systemd variable
(``NOTIFY_SOCKET``, ``WATCHDOG_*``), plus what the test gives: what a test did not ask for
cannot leak in from the shell that runs the suite.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iop_edge.testing.leaks import BOUND, wait_for

__all__ = ["NodeProcess", "iop_node", "node_environment", "node_process"]

#: Variables of the suite's environment a node never inherits (the test sets them itself).
_NOT_INHERITED = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID")


def iop_node() -> str:
    """The ``iop-node`` console script of this interpreter's environment."""
    return str(Path(sys.executable).with_name("iop-node"))


def node_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a node subprocess: this process's without ``IOP_NODE_*`` and the
    systemd variables, then ``env`` over it."""
    base = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("IOP_NODE_") and name not in _NOT_INHERITED
    }
    return {**base, **(env or {})}


@dataclass
class NodeProcess:
    """``iop-node`` running as a subprocess, and every stderr line it wrote so far."""

    process: subprocess.Popen[str]
    lines: list[str]
    #: set once its stderr reached its end (every line it wrote is in :attr:`lines`)
    ended: threading.Event

    @property
    def output(self) -> str:
        """Its whole stderr so far, as one text."""
        return "".join(self.lines)

    def events(self, event: str) -> list[dict[str, Any]]:
        """Every JSON log line so far whose ``event`` is ``event``, parsed."""
        marker = f'"event":"{event}"'
        found: list[dict[str, Any]] = []
        for line in list(self.lines):
            if marker in line:
                with contextlib.suppress(ValueError):
                    found.append(json.loads(line))
        return found

    async def wait_for_log(
        self,
        event: str,
        predicate: Callable[[dict[str, Any]], bool] = lambda line: True,
        *,
        after: int = 0,
    ) -> dict[str, Any]:
        """The first line of ``event`` (from its ``after``-th on) for which ``predicate``
        holds, once the node has written it (bounded by :data:`BOUND`; the loop keeps running
        meanwhile, so an edge served by the test's own loop answers the node)."""

        def find() -> dict[str, Any] | None:
            return next((e for e in self.events(event)[after:] if predicate(e)), None)

        try:
            await wait_for(lambda: find() is not None or self.process.poll() is not None)
        except TimeoutError:
            raise AssertionError(f"no {event!r} log line came:\n{self.output}") from None
        line = find()
        if line is None:
            raise AssertionError(
                f"the node exited {self.process.returncode} before logging {event!r}:\n"
                f"{self.output}"
            )
        return line

    async def exited(self, timeout: float = BOUND) -> int:
        """Its exit status, once it exits by itself and its last log line is read (the loop
        keeps running meanwhile)."""
        try:
            await wait_for(lambda: self.process.poll() is not None and self.ended.is_set(), timeout)
        except TimeoutError:
            raise AssertionError(f"the node did not exit:\n{self.output}") from None
        return self.process.returncode

    async def terminate(self, timeout: float = BOUND) -> int:
        """SIGTERM (what systemd and ``docker stop`` send), then its exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return await self.exited(timeout)


@contextlib.asynccontextmanager
async def node_process(
    *args: str,
    env: Mapping[str, str] | None = None,
    expect_exit: int | None = 0,
    command: tuple[str, ...] | None = None,
) -> AsyncIterator[NodeProcess]:
    """Run ``iop-node ARGS`` (or ``command ARGS``: ``python -m iop_edge.node``, say) with
    :func:`node_environment`'s ``env``, and yield it at once (a node refused at start exits
    before logging anything). On exit a node still running gets SIGTERM and must exit within
    :data:`BOUND`, the loop running meanwhile (its drain closes its links: an edge served by
    this loop must answer); its status must then be ``expect_exit`` (``None``: anything).
    Afterwards :attr:`NodeProcess.lines` holds its whole log (stderr)."""
    process = subprocess.Popen(
        [*(command or (iop_node(),)), *args],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        errors="replace",
        env=node_environment(env),
    )
    lines: list[str] = []
    ended = threading.Event()

    def drain() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
        ended.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        node = NodeProcess(process, lines, ended)
        yield node
        status = await node.terminate()
        if expect_exit is not None:
            assert status == expect_exit, f"iop-node exited {status}:\n{node.output}"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        reader.join(BOUND)
        assert process.stderr is not None
        process.stderr.close()
