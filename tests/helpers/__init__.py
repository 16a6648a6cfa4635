"""Helpers shared by the test modules (one home: a test module never imports another).

The waiting and leak accounting (:func:`wait_for`, :func:`settled`, ...) and the config-file
helpers (:func:`dump`, :func:`rename_save`) live in ``iop_edge.testing``, which the benches
use too; they are re-exported here so that tests import every shared helper from one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from iop_edge.config import parse_config
from iop_edge.config.schema import EdgeConfig
from iop_edge.daemon import Daemon
from iop_edge.options import ServeOptions
from iop_edge.runtime.logs import flush_logs
from iop_edge.supervisor import RefreshRecord, Supervisor, SupervisorOptions
from iop_edge.testing.clock import FakeClock
from iop_edge.testing.fake_openai import FakeOpenAI
from iop_edge.testing.leaks import BOUND, child_pids, leaks, process_gone, settled, wait_for
from iop_edge.testing.reload_storm import dump, rename_save

__all__ = [
    "BOUND",
    "FAKE_CLI",
    "IOP_EDGE",
    "ROOT",
    "Edge",
    "LogCapture",
    "child_pids",
    "child_states",
    "doc_for",
    "dump",
    "edge_on",
    "leaks",
    "only_child",
    "pass_deadline",
    "post",
    "process_gone",
    "rename_save",
    "settled",
    "wait_for",
]

ROOT = Path(__file__).resolve().parents[2]
"""The repository root."""

IOP_EDGE = str(Path(sys.executable).with_name("iop-edge"))
"""The ``iop-edge`` console script of the venv running the tests."""

FAKE_CLI = [sys.executable, "-m", "iop_edge.testing.fake_cli"]
"""The fake command-line agent, as a provider's ``command`` + ``args``."""


class LogCapture(io.StringIO):
    """The log as a file would have it: reading it first writes out the lines the edge queued
    (it writes in batches, up to 20 ms late; :class:`iop_edge.runtime.logs.LineWriter`)."""

    def getvalue(self) -> str:
        flush_logs()
        return super().getvalue()


def child_states(pid: int) -> dict[int, str]:
    """The children of process ``pid``, zombies included, with their states (``R``, ``S``,
    ``Z`` for a zombie, ...), as ``/proc`` shows them."""
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as handle:
                # "pid (comm) state ppid ...": comm may hold spaces, so split after the last ')'
                state, ppid = handle.read().rpartition(")")[2].split()[:2]
        except (OSError, ValueError):
            continue
        if ppid == str(pid):
            found[int(entry)] = state
    return found


async def pass_deadline(
    clock: FakeClock, due: float, ready: Callable[[], bool] | None = None
) -> None:
    """Move ``clock`` onto the deadline ``due`` once a timer is armed for it (and ``ready()``
    holds): first to a millisecond before it, checking that the timer has not fired (a bound
    never passes early), then onto it, which fires it. Run it beside the call the bound ends:
    the call's task then meets the deadline where the daemon's would."""
    await wait_for(lambda: due in clock.armed and (ready is None or ready()))
    clock.advance_to(due - 0.001)
    assert due in clock.armed, f"the timer due at {due} fired before it"
    clock.advance_to(due)
    assert due not in clock.armed


def post(url: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    """POST ``body`` as JSON; the status and the JSON answer (an error status too)."""
    data = json.dumps(body or {}).encode()
    request = urllib.request.Request(
        url, data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=BOUND) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


def only_child(pid: int, other_than: int = 0) -> int:
    """Wait until process ``pid`` has exactly one child, no zombie and not ``other_than``;
    that child."""
    deadline = time.monotonic() + BOUND
    while True:
        children = child_states(pid)
        if len(children) == 1 and "Z" not in children.values() and other_than not in children:
            return next(iter(children))
        assert time.monotonic() < deadline, f"process {pid} keeps the children {children}"
        time.sleep(0.01)


def doc_for(fake: FakeOpenAI | None = None, *, capacity: int = 2, **root: Any) -> dict[str, Any]:
    """A config with the echo model (cat) and, with a fake, the model ``chat`` on it."""
    adapters: list[dict[str, Any]] = [{"name": "shell", "type": "cli", "command": "cat"}]
    providers: list[dict[str, Any]] = [
        {
            "id": "cat",
            "type": "cli",
            "category": "cli",
            "adapter": "shell",
            "models": ["echo"],
            "capacity": capacity,
        },
    ]
    models: list[dict[str, Any]] = [
        {"id": "echo", "context_window_tokens": 4096, "providers": ["cat"]}
    ]
    if fake is not None:
        adapters.append({"name": "oa", "type": "openai_compat", "base_url": fake.base_url})
        providers.append(
            {
                "id": "up",
                "type": "openai_compat",
                "category": "api",
                "adapter": "oa",
                "models": ["fake-model"],
                "capacity": capacity,
            }
        )
        models.append({"id": "chat", "context_window_tokens": 4096, "providers": ["up"]})
    doc = {
        "openai": {"listen": "127.0.0.1:0"},
        "metrics": {"listen": "127.0.0.1:0"},
        "console": {"listen": "127.0.0.1:0"},
        "provider_pool": {"max_queue": 8, "queue_timeout_ms": 30000},
        "models": models,
        "nodes": [{"id": "local", "adapters": adapters, "providers": providers}],
    }
    doc.update(root)
    return doc


class Edge:
    """A running daemon on a config file, with every finished refresh queued for the test."""

    def __init__(self, daemon: Daemon, path: Path) -> None:
        self.daemon = daemon
        self.path = path
        self.records: asyncio.Queue[RefreshRecord] = asyncio.Queue()
        daemon.supervisor.add_listener(self.records.put_nowait)

    @property
    def supervisor(self) -> Supervisor:
        return self.daemon.supervisor

    async def next_record(self) -> RefreshRecord:
        return await asyncio.wait_for(self.records.get(), timeout=15)

    def capacity(self, provider: str = "cat") -> int:
        stats = self.daemon.scheduler.statistics()
        return next(p.capacity for p in stats.providers if p.provider_id == provider)

    async def metrics(self) -> dict[str, float]:
        async with aiohttp.ClientSession() as session, session.get(self.daemon.metrics_url) as r:
            text = await r.text()
        return {
            f"{s.name}{sorted(s.labels.items())}" if s.labels else s.name: s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }


def new_daemon(config: EdgeConfig, **fields: Any) -> Daemon:
    """A daemon on ``config``; each of ``fields`` is a :class:`ServeOptions` field
    (``config_path``, ``watch``, ``argv`` ...) or one of the live objects the daemon is given
    (``clock``, ``notifier`` ...)."""
    names = {f.name for f in dataclasses.fields(ServeOptions)}
    options = ServeOptions(**{k: v for k, v in fields.items() if k in names})
    return Daemon(config, options, **{k: v for k, v in fields.items() if k not in names})


@contextlib.asynccontextmanager
async def edge_on(tmp_path: Path, doc: dict[str, Any], **options: Any) -> AsyncIterator[Edge]:
    path = tmp_path / "edge.yaml"
    path.write_text(dump(doc))
    daemon = new_daemon(
        parse_config(yaml.safe_load(path.read_text())),
        config_path=path,
        supervisor_options=SupervisorOptions(debounce=0.05, settle=0.3, poll_interval=3600),
        **options,
    )
    await daemon.start()
    try:
        yield Edge(daemon, path)
    finally:
        await daemon.stop()
