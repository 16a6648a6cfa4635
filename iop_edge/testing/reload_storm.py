"""A daemon on a watched config file, steady SDK load, and the reload storm — shared by
``tests/reliability`` (small) and ``bench/soak.py`` (full size).

- :class:`WatchedEdge` / :func:`watched_edge`: a daemon on a config file in a temp directory,
  with every finished refresh recorded (through :meth:`Supervisor.add_listener`).
- :class:`SteadyLoad`: SDK clients sending echo requests back to back, checking every answer.
- The reload storm (:func:`storm_plan`, :func:`run_reload_storm`), parametrised by counts.

Everything synchronises on state (scheduler statistics, refresh records); the only real-time
waits are the bounds that make a broken run fail instead of hang. Needs the ``test`` extra
(``openai``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import random
import re
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import openai
import yaml
from openai.types.chat import ChatCompletionMessageParam

from iop_edge.config import load_config, parse_config
from iop_edge.config.policy import pool_policy
from iop_edge.config.refresh import config_hash
from iop_edge.daemon import Daemon
from iop_edge.options import ServeOptions
from iop_edge.pool import PoolPolicy
from iop_edge.supervisor import RefreshRecord, Supervisor, SupervisorOptions
from iop_edge.testing.leaks import leaks, settled, wait_for

_WHOLE_DOCUMENT = re.compile(
    r"^(\S+:\d+:\d+: YAML syntax error: |the config is empty|the config is a \w+; it must be"
    r"|cannot read config )"
)


def error_names_a_path(path: str, message: str) -> bool:
    """The rule for config errors: a non-empty path, or a whole-document error (YAML syntax
    with ``FILE:LINE:COL``, an empty or non-mapping document, an unreadable file)."""
    return bool(path) or bool(_WHOLE_DOCUMENT.match(message))


# --- a daemon on a watched config file -------------------------------------------------------


def dump(doc: dict[str, Any]) -> str:
    """A config document as the YAML an operator would save."""
    return yaml.safe_dump(doc, sort_keys=False)


def rename_save(path: Path, text: str) -> None:
    """Save like an editor: write a temp file next to ``path``, then rename it over."""
    tmp = path.with_name(f".{path.name}.swp")
    tmp.write_text(text)
    os.replace(tmp, path)


class WatchedEdge:
    """A running daemon on a config file; every finished refresh lands in :attr:`records`."""

    def __init__(self, daemon: Daemon, path: Path) -> None:
        self.daemon = daemon
        self.path = path
        self.records: list[RefreshRecord] = []
        daemon.supervisor.add_listener(self.records.append)

    @property
    def supervisor(self) -> Supervisor:
        """The daemon's supervisor (always present: the daemon watches a file)."""
        return self.daemon.supervisor

    async def admin_refresh(self, session: aiohttp.ClientSession) -> dict[str, Any]:
        """``POST /admin/config/refresh?mode=apply``: the refresh result as JSON."""
        url = self.daemon.console_url + "/admin/config/refresh?mode=apply"
        async with session.post(url) as response:
            assert response.status == 200
            result: dict[str, Any] = await response.json()
            return result

    async def admin_status(self, session: aiohttp.ClientSession) -> dict[str, Any]:
        """``GET /admin/status``."""
        async with session.get(self.daemon.console_url + "/admin/status") as response:
            assert response.status == 200
            status: dict[str, Any] = await response.json()
            return status


@contextlib.asynccontextmanager
async def watched_edge(
    directory: Path, doc: dict[str, Any], *, text: str | None = None, settle: float = 0.05
) -> AsyncIterator[WatchedEdge]:
    """Start a daemon on ``directory/edge.yaml`` (written from ``doc``, or ``text`` when
    given) that watches it."""
    path = directory / "edge.yaml"
    path.write_text(dump(doc) if text is None else text)
    daemon = Daemon(
        parse_config(yaml.safe_load(path.read_text())),
        ServeOptions(
            config_path=path,
            supervisor_options=SupervisorOptions(debounce=0.05, settle=settle, poll_interval=3600),
        ),
    )
    await daemon.start()
    try:
        yield WatchedEdge(daemon, path)
    finally:
        await daemon.stop()


# --- steady load -----------------------------------------------------------------------------


@dataclass
class SteadyLoad:
    """``workers`` SDK callers sending echo requests back to back (every other one streaming)
    to ``models`` in turn, until :meth:`stop`. Every answer is checked to be the prompt; any
    exception or wrong answer is a failure, kept with its details."""

    client: openai.AsyncOpenAI
    models: Sequence[str]
    workers: int
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _stopping: bool = False

    @property
    def sent(self) -> int:
        """Requests finished so far, successful or not."""
        return self.ok + len(self.failures)

    def start(self) -> None:
        """Start the workers."""
        self._tasks = [
            asyncio.create_task(self._worker(i), name=f"load-{i}") for i in range(self.workers)
        ]

    async def stop(self) -> None:
        """Let every worker finish its current request, then stop."""
        self._stopping = True
        await asyncio.gather(*self._tasks)

    async def progress(self, count: int = 1) -> None:
        """Return once ``count`` more requests have finished (the load is really flowing)."""
        target = self.sent + count
        await wait_for(lambda: self.sent >= target or not self._alive())

    def _alive(self) -> bool:
        return any(not t.done() for t in self._tasks)

    async def _worker(self, index: int) -> None:
        turn = 0
        while not self._stopping:
            model = self.models[(index + turn) % len(self.models)]
            prompt = f"load {index} {turn}"
            stream = turn % 2 == 1
            turn += 1
            try:
                text = await self._ask(model, prompt, stream)
            except openai.APIError as exc:
                status = getattr(exc, "status_code", None)
                self.failures.append(f"{model} stream={stream}: {status} {exc.code} {exc}")
                continue
            if text.strip() != prompt:
                self.failures.append(f"{model} stream={stream}: answered {text!r} to {prompt!r}")
            else:
                self.ok += 1

    async def _ask(self, model: str, prompt: str, stream: bool) -> str:
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": prompt}]
        if not stream:
            reply = await self.client.chat.completions.create(model=model, messages=messages)
            return reply.choices[0].message.content or ""
        chunks = await self.client.chat.completions.create(
            model=model, messages=messages, stream=True
        )
        text = ""
        async for chunk in chunks:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
        return text


# --- the reload storm ------------------------------------------------------------------------

STORM_PROVIDERS = ("oa-1", "oa-2", "ol-1")
"""The providers of the storm's one model group ``chat``: two OpenAI-compatible, one Ollama."""


@dataclass(frozen=True)
class StormState:
    """The live values one good storm file sets."""

    capacity: tuple[int, ...]
    priority: tuple[int, ...]
    enabled: tuple[bool, ...]
    max_queue: int
    queue_timeout_ms: int


def storm_doc(oa_url: str, ol_url: str, state: StormState) -> dict[str, Any]:
    """The storm's config for ``state``: model ``chat`` on three providers, model ``echo`` on
    ``cat`` (never changed), and the admin API on an ephemeral port."""
    providers: list[dict[str, Any]] = []
    for index, pid in enumerate(STORM_PROVIDERS):
        kind, adapter = ("ollama", "ol") if pid.startswith("ol") else ("openai_compat", "oa")
        providers.append(
            {
                "id": pid,
                "type": kind,
                "category": "local_inference",
                "adapter": adapter,
                "models": ["fake-model"],
                "capacity": state.capacity[index],
                "priority": state.priority[index],
                "enabled": state.enabled[index],
            }
        )
    providers.append(
        {"id": "cat", "type": "cli", "category": "cli", "adapter": "shell", "models": ["echo"]}
    )
    return {
        "openai": {"listen": "127.0.0.1:0"},
        "metrics": {"listen": "127.0.0.1:0"},
        "console": {"listen": "127.0.0.1:0"},
        "logging": {"level": "warning"},
        "provider_pool": {"max_queue": state.max_queue, "queue_timeout_ms": state.queue_timeout_ms},
        "models": [
            {"id": "chat", "context_window_tokens": 4096, "providers": list(STORM_PROVIDERS)},
            {"id": "echo", "context_window_tokens": 4096, "providers": ["cat"]},
        ],
        "nodes": [
            {
                "id": "local",
                "adapters": [
                    {"name": "oa", "type": "openai_compat", "base_url": oa_url},
                    {"name": "ol", "type": "ollama", "base_url": ol_url},
                    {"name": "shell", "type": "cli", "command": "cat"},
                ],
                "providers": providers,
            }
        ],
    }


def storm_states(rng: random.Random, count: int, workers: int) -> list[StormState]:
    """``count`` successive states, each different from the one before.

    The load is designed so that the policy never calls for a failure: ``max_queue >=
    workers`` (at most ``workers - 1`` others are pending when a request arrives, so no
    ``queue_full``), at least one provider of ``chat`` stays enabled (no
    ``no_available_provider``), and the queue timeout is 0 (none) or at least 5 s, far above
    any wait a request of this load sees (no ``queue_timeout``).
    """
    states: list[StormState] = []
    previous: StormState | None = None
    while len(states) < count:
        enabled = tuple(rng.random() < 0.7 for _ in STORM_PROVIDERS)
        if not any(enabled):
            enabled = tuple(i == rng.randrange(len(STORM_PROVIDERS)) for i in range(3))
        state = StormState(
            capacity=tuple(rng.randint(1, 3) for _ in STORM_PROVIDERS),
            priority=tuple(rng.randint(0, 5) for _ in STORM_PROVIDERS),
            enabled=enabled,
            max_queue=rng.randint(workers, workers + 16),
            queue_timeout_ms=rng.choice([0, 5000, 10000, 30000, 60000]),
        )
        if state != previous:
            states.append(state)
            previous = state
    return states


def _bad_edits() -> list[tuple[str, Callable[[dict[str, Any], str], str]]]:
    """Twenty ways to break a good storm file, each named; each returns the bad YAML text."""

    def edit(change: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any], str], str]:
        def apply(doc: dict[str, Any], text: str) -> str:
            bad = copy.deepcopy(doc)
            change(bad)
            return dump(bad)

        return apply

    def provider(doc: dict[str, Any], index: int = 0) -> dict[str, Any]:
        found: dict[str, Any] = doc["nodes"][0]["providers"][index]
        return found

    def pool(doc: dict[str, Any]) -> dict[str, Any]:
        found: dict[str, Any] = doc["provider_pool"]
        return found

    return [
        ("yaml syntax", lambda doc, text: text + "models: [\n"),
        ("duplicate key", lambda doc, text: text + "provider_pool: {max_queue: 3}\n"),
        ("tab indentation", lambda doc, text: text.replace("\n- id: chat", "\n\t- id: chat", 1)),
        ("truncated file", lambda doc, text: text[: len(text) // 3]),
        ("empty file", lambda doc, text: ""),
        ("negative priority", edit(lambda d: provider(d).update(priority=-1))),
        ("capacity as text", edit(lambda d: provider(d).update(capacity="4"))),
        ("capacity zero", edit(lambda d: provider(d, 1).update(capacity=0))),
        ("misspelt key", edit(lambda d: provider(d).update(capcity=2))),
        ("long slots over capacity", edit(lambda d: provider(d).update(long_context_capacity=9))),
        ("negative max_queue", edit(lambda d: pool(d).update(max_queue=-1))),
        ("timeout as text", edit(lambda d: pool(d).update(queue_timeout_ms="soon"))),
        ("enabled as text", edit(lambda d: provider(d, 2).update(enabled="yes"))),
        ("unknown provider", edit(lambda d: d["models"][0]["providers"].append("ghost"))),
        ("empty provider list", edit(lambda d: d["models"][1].update(providers=[]))),
        ("duplicate provider id", edit(lambda d: provider(d, 1).update(id="oa-1"))),
        ("unknown root key", edit(lambda d: d.update(provider_poll={"max_queue": 4}))),
        ("bad category", edit(lambda d: provider(d).update(category="gpu"))),
        (
            "node listener off loopback without tls",
            edit(
                lambda d: d.update(bootstrap={"enabled": True}, listen={"address": "0.0.0.0:7600"})
            ),
        ),
        ("nothing to serve", edit(lambda d: d.update(models=[]))),
    ]


BAD_EDITS = _bad_edits()


@dataclass(frozen=True)
class StormStep:
    """One save of the storm: the text, whether it is good, how it reaches the daemon."""

    text: str
    good: bool
    via: str  # "file" (the watcher) or "api" (POST /admin/config/refresh)
    name: str


def storm_plan(
    oa_url: str, ol_url: str, *, good: int, bad: int, workers: int, seed: int = 7
) -> list[StormStep]:
    """``good`` live edits and ``bad`` rejected files, the bad ones spread evenly and the last
    step always bad (the final state must be the last *good* file's). Triggers alternate
    between the file watcher and the admin API."""
    rng = random.Random(seed)
    states = storm_states(rng, good, workers)
    bad_at = {round((k + 1) * (good + bad) / bad) - 1 for k in range(bad)} if bad else set()
    steps: list[StormStep] = []
    current = storm_doc(oa_url, ol_url, states[0])
    next_good = 0
    for index in range(good + bad):
        via = "file" if index % 2 == 0 else "api"
        if index in bad_at or next_good == good:
            name, breaker = BAD_EDITS[len([s for s in steps if not s.good]) % len(BAD_EDITS)]
            steps.append(StormStep(breaker(current, dump(current)), False, via, name))
        else:
            current = storm_doc(oa_url, ol_url, states[next_good])
            next_good += 1
            steps.append(StormStep(dump(current), True, via, "live edit"))
    return steps


@dataclass
class StormReport:
    """What a reload storm did and saw."""

    refreshes_applied: int = 0
    files_rejected: int = 0
    requests_ok: int = 0
    request_failures: list[str] = field(default_factory=list)
    error_paths: list[str] = field(default_factory=list)
    unnamed_errors: list[str] = field(default_factory=list)
    misjudged: list[str] = field(default_factory=list)
    leaks: dict[str, int] = field(default_factory=dict)
    final_policy_matches: bool = False
    final_hash_matches: bool = False
    admin_status_matches: bool = False


def _runs_policy(edge: WatchedEdge, policy: PoolPolicy) -> Callable[[], bool]:
    return lambda: edge.daemon.scheduler.policy == policy


def _rejected_since(edge: WatchedEdge, start: int) -> Callable[[], bool]:
    return lambda: any(r.result.result == "rejected" for r in edge.records[start:])


def records_since(edge: WatchedEdge, start: int) -> Callable[[], bool]:
    """A predicate: a refresh finished after the first ``start`` records."""
    return lambda: len(edge.records) > start


def expected_policy(text: str) -> PoolPolicy:
    """The scheduler policy a good file must produce."""
    return pool_policy(load_config(text))


def _check_errors(report: StormReport, step: StormStep, errors: Iterable[Any]) -> None:
    for error in errors:
        path = error["path"] if isinstance(error, dict) else error.path
        message = error["message"] if isinstance(error, dict) else error.message
        report.error_paths.append(f"{step.name}: {path or message[:60]}")
        if not error_names_a_path(path, message):
            report.unnamed_errors.append(f"{step.name}: {message}")


def status_matches(status: dict[str, Any], policy: PoolPolicy) -> bool:
    """Whether ``/admin/status`` (or ``iop-edge status --json``) shows exactly ``policy``."""
    shown = [
        (p["node"], p["id"], p["enabled"], p["capacity"], p["priority"])
        for p in status["providers"]
    ]
    wanted = [
        (p.node_id, p.provider_id, p.enabled, p.capacity if p.enabled else 0, p.priority)
        for p in policy.providers
    ]
    queue = status["queue"]
    return (
        shown == wanted
        and queue["max_queue"] == policy.max_queue
        and queue["queue_timeout_ms"] == policy.queue_timeout_ms
    )


async def run_reload_storm(
    edge: WatchedEdge, steps: Sequence[StormStep], load: SteadyLoad
) -> StormReport:
    """Apply ``steps`` one after the other while ``load`` flows; every step waits until the
    daemon has judged it and at least one more request has finished. Stops the load, waits
    for rest, and compares the final state with the last good file."""
    report = StormReport()
    last_good: str | None = None
    async with aiohttp.ClientSession() as session:
        for step in steps:
            before = len(edge.records)
            rename_save(edge.path, step.text)
            if step.via == "api":
                result = await edge.admin_refresh(session)
                verdict = result["result"]
                errors: list[Any] = result["errors"]
            else:
                if step.good:
                    policy = expected_policy(step.text)
                    await wait_for(_runs_policy(edge, policy))
                    verdict, errors = "applied", []
                else:
                    await wait_for(_rejected_since(edge, before))
                    rejected = next(
                        r.result for r in edge.records[before:] if r.result.result == "rejected"
                    )
                    verdict, errors = "rejected", list(rejected.errors)
            if step.good:
                last_good = step.text
                if verdict == "applied" and edge.daemon.scheduler.policy == expected_policy(
                    step.text
                ):
                    report.refreshes_applied += 1
                else:
                    report.misjudged.append(f"good step via {step.via}: {verdict}")
            else:
                if verdict == "rejected" and errors:
                    report.files_rejected += 1
                else:
                    report.misjudged.append(f"{step.name} via {step.via}: {verdict}")
                _check_errors(report, step, errors)
            await load.progress(1)
        await load.stop()
        report.requests_ok, report.request_failures = load.ok, list(load.failures)
        with contextlib.suppress(AssertionError):
            await settled(edge.daemon)
        report.leaks = {k: v for k, v in leaks(edge.daemon).items() if v}
        assert last_good is not None
        final = load_config(last_good)
        report.final_policy_matches = edge.daemon.scheduler.policy == pool_policy(final)
        report.final_hash_matches = edge.supervisor.running_hash == config_hash(final)
        status = await edge.admin_status(session)
        report.admin_status_matches = status_matches(status, pool_policy(final)) and status[
            "config"
        ]["hash"] == config_hash(final)
    return report


async def cli_status(console_url: str) -> dict[str, Any]:
    """``iop-edge status --json --console URL``, as an operator runs it."""
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("iop-edge")),
        "status",
        "--json",
        "--console",
        console_url,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await process.communicate()
    assert process.returncode == 0
    status: dict[str, Any] = json.loads(out)
    return status
