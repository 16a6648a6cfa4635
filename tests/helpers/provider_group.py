"""A model group of providers on an edge that runs on a fake clock, and what a client and an
operator see of it: the shared pieces of the provider-health tests (SPEC §5.1, issue 12),
``test_failover.py`` (faults and retries) and ``test_ejection.py`` (ejection, probes, panic,
live refresh).

The daemon runs on a :class:`~iop_edge.testing.clock.FakeClock`: ejections, 429 holds and
probes happen when a test moves the clock, so their times are exact. Only the adapters' own
deadlines run on the loop's real time (``SHORT_MS``).
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai

from iop_edge.pool import PoolStatistics, ProviderStatistics
from iop_edge.testing.clock import FakeClock
from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_ollama import FakeOllama
from iop_edge.testing.fake_openai import FakeOpenAI
from iop_edge.testing.fake_upstream import FakeUpstream
from tests.helpers import FAKE_CLI, Edge, edge_on, wait_for
from tests.helpers.upstreams import closed_port

START = 1000.0
"""Where the daemon's fake clock starts."""

SHORT_MS = 200
"""``request_timeout_ms`` of a provider whose timeout is the fault (on the daemon's fake clock,
like every deadline: the test moves it there)."""

ADAPTERS = {"openai_compat": "oa", "ollama": "ol", "cli": "shell"}
FAKES: dict[str, type[FakeUpstream]] = {"openai_compat": FakeOpenAI, "ollama": FakeOllama}
PROBE_PATHS = {"openai_compat": "/v1/models", "ollama": "/api/tags"}

# --- the config ------------------------------------------------------------------------------


def http_provider(
    pid: str, kind: str, base_url: str, *, priority: int = 0, **fields: Any
) -> dict[str, Any]:
    """An ``openai_compat`` or ``ollama`` provider of model ``m`` at ``base_url``."""
    return {
        "id": pid,
        "type": kind,
        "category": "local_inference",
        "adapter": ADAPTERS[kind],
        "base_url": base_url,
        "models": ["fake-model"],
        "capacity": 2,
        "priority": priority,
        **fields,
    }


def agent(pid: str, *options: str, priority: int = 0, **fields: Any) -> dict[str, Any]:
    """A ``cli`` provider of model ``m`` running the fake agent with ``options``."""
    return {
        "id": pid,
        "type": "cli",
        "category": "cli",
        "adapter": "shell",
        "command": FAKE_CLI[0],
        "args": [*FAKE_CLI[1:], "--format", "stream-json", *options],
        "output_format": "stream-json",
        "models": ["fake-model"],
        "capacity": 2,
        "priority": priority,
        **fields,
    }


def group_doc(*providers: dict[str, Any], max_attempts: int = 2, **health: int) -> dict[str, Any]:
    """Model ``m`` served by ``providers`` (config order) on node ``n1``; ``health`` overrides
    ``provider_pool.health`` (``failure_threshold`` 3 and 10 s ejections by default)."""
    return {
        "openai": {"listen": "127.0.0.1:0"},
        "metrics": {"listen": "127.0.0.1:0"},
        "console": {"listen": "127.0.0.1:0"},
        "provider_pool": {
            "max_queue": 64,
            "queue_timeout_ms": 30000,
            "failover": {"max_attempts": max_attempts},
            "health": {"failure_threshold": 3, "eject_ms": 10000, **health},
        },
        "models": [
            {"id": "m", "context_window_tokens": 4096, "providers": [p["id"] for p in providers]}
        ],
        "nodes": [
            {
                "id": "n1",
                "adapters": [
                    {"name": "oa", "type": "openai_compat"},
                    {"name": "ol", "type": "ollama"},
                    {"name": "shell", "type": "cli", "command": "cat"},
                ],
                "providers": list(providers),
            }
        ],
    }


@contextlib.asynccontextmanager
async def running(tmp_path: Path, doc: dict[str, Any]) -> AsyncIterator[tuple[Edge, FakeClock]]:
    """The daemon on ``doc`` and its fake clock (no file watcher: refreshes are asked for)."""
    clock = FakeClock(START)
    async with edge_on(tmp_path, doc, clock=clock, watch=False) as edge:
        yield edge, clock


# --- what a client and an operator see -------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """A successful answer: the provider that gave it (``x-iop-provider``) and its text."""

    provider: str | None
    text: str


@contextlib.asynccontextmanager
async def sdk_for(edge: Edge) -> AsyncIterator[openai.AsyncOpenAI]:
    """The ``openai`` SDK on the edge, retries off (the edge's failover is under test)."""
    async with openai.AsyncOpenAI(
        base_url=edge.daemon.openai_url, api_key="unused", max_retries=0
    ) as sdk:
        yield sdk


async def chat(sdk: openai.AsyncOpenAI, content: str, *, stream: bool = False) -> Answer:
    """One chat request to model ``m``; raises the SDK's error for an error answer (or an
    error event in the stream)."""
    messages: Any = [{"role": "user", "content": content}]
    if not stream:
        raw = await sdk.chat.completions.with_raw_response.create(model="m", messages=messages)
        completion = raw.parse()
        return Answer(
            raw.headers.get("x-iop-provider"), completion.choices[0].message.content or ""
        )
    raw_stream = await sdk.chat.completions.with_raw_response.create(
        model="m", messages=messages, stream=True
    )
    chunks = raw_stream.parse()
    text = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
    return Answer(raw_stream.headers.get("x-iop-provider"), text)


def provider(edge: Edge, pid: str) -> ProviderStatistics:
    """Provider ``pid``'s slots and health as the scheduler's public snapshot shows them."""
    return next(p for p in edge.daemon.scheduler.statistics().providers if p.provider_id == pid)


async def admin_status(edge: Edge) -> dict[str, Any]:
    """``GET /admin/status`` as an operator reads it."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(edge.daemon.console_url + "/admin/status") as response,
    ):
        assert response.status == 200
        status: dict[str, Any] = await response.json()
        return status


def sample(name: str, **labels: str) -> str:
    """The key of one sample in :meth:`Edge.metrics`."""
    return f"{name}{sorted(labels.items())}"


def failovers(metrics: dict[str, float]) -> dict[str, float]:
    """``iop_edge_failovers_total`` of model ``m`` by reason (reasons never counted left out)."""
    prefix = "iop_edge_failovers_total[('model', 'm'), ('reason', '"
    return {k[len(prefix) : -3]: v for k, v in metrics.items() if k.startswith(prefix)}


def log_events(log_stream: io.StringIO, event: str) -> list[dict[str, Any]]:
    """Every structured log line of ``event`` the edge wrote so far, in order."""
    lines = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    return [line for line in lines if line.get("event") == event]


async def probed(edge: Edge, pid: str, *, failed: int) -> None:
    """Wait until provider ``pid`` has had ``failed`` failed probes."""
    await wait_for(lambda: provider(edge, pid).probes_failed == failed)


async def all_released(edge: Edge) -> PoolStatistics:
    """Wait for every lease to come back, then check each was released exactly once and the
    scheduler's identity ``submitted + failovers == admitted + rejected + queued`` holds."""
    scheduler = edge.daemon.scheduler
    await wait_for(lambda: scheduler.statistics().in_flight == 0)
    stats = scheduler.statistics()
    assert (stats.in_flight, stats.double_releases) == (0, 0)
    assert stats.released == stats.admitted + stats.inherited
    assert stats.submitted + stats.failovers == (
        stats.admitted + stats.rejected_total + stats.queue_depth
    )
    return stats


# --- a provider failing one way, next to a healthy one ----------------------------------------


@dataclass(frozen=True)
class Fault:
    """How the sick provider fails: its fake's behaviour (HTTP) or the fake agent's
    ``options`` (cli), its config ``fields``, or nothing listening on its port."""

    reason: str
    """The ``reason`` label of ``iop_edge_failovers_total``."""
    behavior: FakeBehavior | None = None
    fields: tuple[tuple[str, Any], ...] = ()
    options: tuple[str, ...] = ()
    refused: bool = False

    @property
    def error_labels(self) -> dict[str, str]:
        """The ``reason`` and ``status_code`` labels of ``iop_edge_upstream_errors_total`` for
        the failed attempt."""
        if self.behavior is not None and self.behavior.status != 200:
            return {"reason": "status", "status_code": str(self.behavior.status)}
        return {"reason": "timeout" if self.reason == "timeout" else "error", "status_code": ""}


HTTP_FAULTS = {
    "refused": Fault("connect", refused=True),
    "disconnect": Fault("dropped", FakeBehavior(fault="disconnect")),
    "timeout": Fault("timeout", FakeBehavior(latency=5.0), (("request_timeout_ms", SHORT_MS),)),
    "500": Fault("status_5xx", FakeBehavior(status=500)),
    "502": Fault("status_5xx", FakeBehavior(status=502)),
    "503": Fault("status_5xx", FakeBehavior(status=503)),
    "504": Fault("status_5xx", FakeBehavior(status=504)),
    "429": Fault("status_429", FakeBehavior(status=429)),
    "429-retry-after": Fault("status_429", FakeBehavior(status=429, retry_after="7")),
}
EVERY_CLASS = ("retry_on", ["connect", "timeout_before_head", "5xx"])
"""A cli provider's ``retry_on`` widened to every class (its default is ``[connect]``)."""
CLI_FAULTS = {
    "cannot-spawn": Fault("connect", fields=(("command", "/nonexistent/agent-binary"),)),
    "exit-before-output": Fault(
        "exit", fields=(EVERY_CLASS,), options=("--exit-code", "3", "--stderr", "boom")
    ),
    "timeout-before-output": Fault(
        "timeout", fields=(("request_timeout_ms", SHORT_MS), EVERY_CLASS), options=("--hang",)
    ),
}


@contextlib.asynccontextmanager
async def sick_and_well(
    kind: str, fault: Fault | None = None
) -> AsyncIterator[tuple[dict[str, Any], dict[str, Any], FakeUpstream | None, FakeUpstream | None]]:
    """Providers ``sick`` (priority 0: tried first, failing as ``fault`` says) and ``well``
    (priority 1) of adapter ``kind``, with their fakes (``None`` for ``cli``)."""
    fault = fault or Fault("none")
    overrides = dict(fault.fields)
    if kind == "cli":
        yield agent("sick", *fault.options, **overrides), agent("well", priority=1), None, None
        return
    fake_type = FAKES[kind]
    async with fake_type() as sick, fake_type() as well:
        if fault.behavior is not None:
            sick.behavior = fault.behavior
        url = sick.base_url
        if fault.refused:
            url = url.replace(f":{sick.port}", f":{closed_port()}")
        yield (
            http_provider("sick", kind, url, **overrides),
            http_provider("well", kind, well.base_url, priority=1),
            sick,
            well,
        )
