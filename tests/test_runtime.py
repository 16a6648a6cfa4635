"""The process shell is reusable (``iop_edge.runtime``): a second program — the node agent — can
be built on it without the edge's HTTP surfaces, admission, refresh or handover.

Held two ways: importing the whole runtime loads none of the edge-only modules (in a fresh
interpreter, so nothing the suite imported earlier hides it), and a small program made only of
runtime parts — a lifecycle, a listener with its cap and timeouts, sd_notify to a real Unix
datagram socket — serves a request, says READY and STOPPING to its supervisor, and drains.
That second program exists: ``iop-node`` (:mod:`iop_edge.node`) loads the runtime and the
adapters and nothing of the edge's admission, HTTP surfaces, handover or command line.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
from aiohttp import web

from iop_edge.runtime.clock import MonotonicClock
from iop_edge.runtime.lifecycle import Lifecycle, Phase
from iop_edge.runtime.listeners import ConnectionLimits, Listener
from iop_edge.runtime.logs import get_logger
from iop_edge.runtime.systemd import Notifier
from tests.helpers.imports import PACKAGE_DIR

RUNTIME = sorted(
    f"iop_edge.runtime.{path.stem}"
    for path in (PACKAGE_DIR / "runtime").glob("*.py")
    if path.stem != "__init__"
)
EDGE_ONLY = (
    "iop_edge.api",
    "iop_edge.admission",
    "iop_edge.pool",
    "iop_edge.adapters",
    "iop_edge.supervisor",
    "iop_edge.config_source",
    "iop_edge.daemon",
    "iop_edge.handover",
    "iop_edge.cli",
    "iop_edge.metrics",
    "iop_edge.collectors",
)


def test_the_runtime_loads_nothing_of_the_edge_alone():
    """Every runtime module imported in a fresh interpreter: no edge-only module comes along."""
    assert len(RUNTIME) >= 8, RUNTIME  # (guards against checking an empty package)
    script = (
        "import importlib, sys\n"
        f"for name in {RUNTIME!r}: importlib.import_module(name)\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout.split()
    assert set(RUNTIME) <= set(loaded)
    leaked = [m for m in loaded if any(m == e or m.startswith(f"{e}.") for e in EDGE_ONLY)]
    assert not leaked, f"importing the runtime loads edge-only modules: {leaked}"


async def test_a_second_program_runs_on_the_runtime_alone(tmp_path: Path) -> None:
    """A lifecycle, a listener and sd_notify: what ``iop-node`` needs from the shell, used
    without a daemon."""
    notify_path = tmp_path / "notify"
    systemd = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    systemd.bind(str(notify_path))
    systemd.settimeout(5)
    lifecycle = Lifecycle()
    notifier = Notifier({"NOTIFY_SOCKET": str(notify_path)})

    async def hello(request: web.Request) -> web.Response:
        return web.json_response({"phase": lifecycle.phase.value})

    app = web.Application()
    app.router.add_get("/hello", hello)
    limits = ConnectionLimits(
        keepalive_timeout=5, header_timeout=5, write_timeout=5, max_connections=4
    )
    listener = await Listener.bind(
        "node", app, "127.0.0.1:0", limits, clock=MonotonicClock(), log=get_logger()
    )
    try:
        lifecycle.enter(Phase.READY)
        notifier.ready("serving")
        assert systemd.recv(4096).decode().split("\n")[:2] == ["READY=1", "STATUS=serving"]
        async with (
            aiohttp.ClientSession() as session,
            session.get(listener.url + "/hello") as response,
        ):
            assert response.status == 200
            assert await response.json() == {"phase": "ready"}
        assert listener.statistics().name == "node"
        lifecycle.enter(Phase.STOPPING)
        notifier.stopping()
        assert systemd.recv(4096).decode().startswith("STOPPING=1")
        listener.stop_accepting()
        assert await listener.drain(until=MonotonicClock().now() + 5)
    finally:
        await listener.close()
        notifier.close()
        systemd.close()
    assert lifecycle.phase is Phase.STOPPING


NODE = sorted(
    f"iop_edge.node.{path.stem}"
    for path in (PACKAGE_DIR / "node").glob("*.py")
    if path.stem not in ("__init__", "__main__")
)
NOT_IN_THE_NODE = (
    "iop_edge.api",
    "iop_edge.admission",
    "iop_edge.pool",
    "iop_edge.handover",
    "iop_edge.daemon",
    "iop_edge.cli",
    "iop_edge.supervisor",
    "iop_edge.config_source",
    "iop_edge.metrics",
    "iop_edge.collectors",
)


def test_the_node_program_loads_nothing_of_the_edge_but_the_adapters():
    """``iop-node`` (design §3): every module of :mod:`iop_edge.node` imported in a fresh
    interpreter loads the runtime and the adapters, and no admission, pool, HTTP surface,
    handover, daemon or command line module — ``iop_edge.cli`` least of all: importing it makes
    a process the thin parent of an ``iop-edge serve``."""
    assert {"iop_edge.node.program", "iop_edge.node.generations"} <= set(NODE), NODE
    script = (
        "import importlib, sys\n"
        f"for name in {NODE!r}: importlib.import_module(name)\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout.split()
    assert {*NODE, "iop_edge.adapters.registry", "iop_edge.runtime.systemd"} <= set(loaded)
    leaked = [m for m in loaded if any(m == e or m.startswith(f"{e}.") for e in NOT_IN_THE_NODE)]
    assert not leaked, f"importing iop_edge.node loads edge-only modules: {leaked}"
