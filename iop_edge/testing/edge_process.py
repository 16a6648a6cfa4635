"""``iop-edge serve`` as a subprocess (:class:`EdgeProcess`), run as an operator runs it, and
what an operator reads back: its log events, ``/admin/status``, ``/metrics``, and whether it
holds nothing once at rest (no slot, queue entry or child process left). The hostile-input
tests (``tests/reliability``) and ``bench/soak.py`` run the edge this way."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iop_edge.testing.leaks import BOUND, children_of, wait_for
from iop_edge.testing.raw_http import raw_answer

LISTENERS = ("openai", "console", "metrics", "nodes")
"""The listeners whose addresses :class:`EdgeProcess` keeps from the ``listening`` event."""


@dataclass
class EdgeProcess:
    """``iop-edge serve`` running as a subprocess: every stderr line it wrote so far, and the
    addresses of its ``listening`` event (``openai``, ``console``, ``metrics``, and ``nodes``,
    the node listener, when a node is remote)."""

    process: subprocess.Popen[str]
    lines: list[str]
    addresses: dict[str, str]

    def host_port(self, listener: str) -> tuple[str, int]:
        """``(host, port)`` of one listener, for raw sockets."""
        rest = self.addresses[listener].split("://", 1)[1]
        host, _, port = rest.rpartition(":")
        return host.strip("[]"), int(port)


@contextlib.contextmanager
def edge_process(config: Path) -> Iterator[EdgeProcess]:
    """Run ``iop-edge serve --config config`` as an operator would; yield an
    :class:`EdgeProcess` once it logs ``listening``. On exit it gets SIGTERM and must exit 0
    within :data:`BOUND`; afterwards :attr:`EdgeProcess.lines` holds its whole log (stderr).
    The server runs in the process started (``--no-parent``): its children are its CLI runs,
    which :func:`edge_at_rest` counts."""
    iop_edge = str(Path(sys.executable).with_name("iop-edge"))
    process = subprocess.Popen(
        [iop_edge, "serve", "--config", str(config), "--no-parent"],
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
    )
    lines: list[str] = []
    listening = threading.Event()
    addresses: dict[str, str] = {}

    def drain() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            if not listening.is_set() and '"listening"' in line:
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    addresses.update({k: v for k, v in event.items() if k in LISTENERS})
                    listening.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        if not listening.wait(BOUND):
            raise AssertionError("the daemon did not start:\n" + "".join(lines))
        yield EdgeProcess(process, lines, addresses)
        process.send_signal(signal.SIGTERM)
        assert process.wait(BOUND) == 0, "".join(lines)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        reader.join(BOUND)
        assert process.stderr is not None
        process.stderr.close()


def log_events(edge: EdgeProcess, event: str) -> list[dict[str, Any]]:
    """Every JSON line of the edge's log so far whose ``event`` is ``event``, parsed."""
    marker = f'"event":"{event}"'
    found: list[dict[str, Any]] = []
    for line in list(edge.lines):
        if marker in line:
            with contextlib.suppress(ValueError):
                found.append(json.loads(line))
    return found


async def wait_for_log(
    edge: EdgeProcess,
    event: str,
    predicate: Callable[[dict[str, Any]], bool] = lambda line: True,
    *,
    after: int = 0,
) -> dict[str, Any]:
    """The first line of ``event`` (from its ``after``-th on) for which ``predicate`` holds,
    once the edge has written it (bounded by :data:`BOUND`)."""

    def find() -> dict[str, Any] | None:
        return next((e for e in log_events(edge, event)[after:] if predicate(e)), None)

    try:
        await wait_for(lambda: find() is not None)
    except TimeoutError:
        raise AssertionError(f"no {event!r} log line came:\n" + "".join(edge.lines[-20:])) from None
    line = find()
    assert line is not None
    return line


async def edge_status(edge: EdgeProcess) -> dict[str, Any]:
    """``GET /admin/status`` of the edge's console (loopback, no admin token)."""
    answer = await raw_answer(
        *edge.host_port("console"),
        b"GET /admin/status HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    assert answer.status == 200, answer
    status: dict[str, Any] = json.loads(answer.body)
    return status


async def edge_metrics(edge: EdgeProcess) -> dict[str, float]:
    """``GET /metrics`` of the edge: every sample, keyed by its name and labels as exposed
    (``iop_edge_listener_connections{listener="openai"}``)."""
    answer = await raw_answer(
        *edge.host_port("metrics"),
        b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    assert answer.status == 200, answer
    samples: dict[str, float] = {}
    for line in answer.body.decode().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    return samples


def status_leaks(status: dict[str, Any]) -> dict[str, int]:
    """What ``/admin/status`` shows still held: slots in flight, the queue, admissions (and
    leases inherited by a handover) not released, double releases. Empty when the edge is at
    rest."""
    counters = status["counters"]
    held = {
        "in_flight": sum(p["in_flight"] for p in status["providers"]),
        "queue_depth": status["queue"]["depth"],
        "unreleased": counters["admitted"] + counters["inherited"] - counters["released"],
        "double_releases": counters["double_releases"],
    }
    return {name: value for name, value in held.items() if value}


async def edge_at_rest(edge: EdgeProcess) -> dict[str, Any]:
    """Wait until the edge holds nothing (:func:`status_leaks` empty, no child process left:
    every CLI run reaped), then return its status; a leak fails after :data:`BOUND`."""
    pid = edge.process.pid
    status = await edge_status(edge)
    loop = asyncio.get_running_loop()
    give_up = loop.time() + BOUND
    while (status_leaks(status) or children_of(pid)) and loop.time() < give_up:
        await asyncio.sleep(0.01)
        status = await edge_status(edge)
    assert (status_leaks(status), children_of(pid)) == ({}, {}), status
    return status
