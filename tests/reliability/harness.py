"""Machinery shared by the reliability tests and ``bench/soak.py``.

- Leak accounting: :func:`leaks` (scheduler slots and queue, releases, CLI process groups,
  child processes) and :func:`settled`, which waits for the edge to come to rest.
- :class:`WatchedEdge` / :func:`watched_edge`: a daemon on a config file in a temp directory,
  with every finished refresh recorded.
- :class:`SteadyLoad`: SDK clients sending echo requests back to back, checking every answer.
- The reload storm (:func:`storm_plan`, :func:`run_reload_storm`) and the config fuzzer
  (:func:`fuzz_texts`, :func:`run_config_fuzz`), parametrised by counts so that the test
  suite runs them small and the soak runs them long.

Everything synchronises on state (scheduler statistics, refresh records, the fakes' counters);
the only real-time waits are the bounds that make a broken run fail instead of hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import openai
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionMessageParam

from iop_edge.adapters.cli_process import CliTracker
from iop_edge.config import ConfigError, load_config, parse_config
from iop_edge.config.policy import pool_policy
from iop_edge.config.refresh import RefreshResult, config_hash
from iop_edge.daemon import Daemon
from iop_edge.pool import PoolPolicy, PoolStatistics
from iop_edge.supervisor import RefreshRecord, Supervisor, SupervisorOptions
from tests.strategies import mutate, mutated_docs

FAKE_CLI = [sys.executable, "-m", "iop_edge.testing.fake_cli"]
"""The fake command-line agent, as a provider's ``command`` + ``args``."""

BOUND = 20.0
"""Seconds any single wait may take before the run is declared broken (never a timing)."""

_WHOLE_DOCUMENT = re.compile(
    r"^(\S+:\d+:\d+: YAML syntax error: |the config is empty|the config is a \w+; it must be"
    r"|cannot read config )"
)


# --- waiting and leak accounting -------------------------------------------------------------


async def wait_for(predicate: Callable[[], bool], timeout: float = BOUND) -> None:
    """Let the loop run until ``predicate()`` holds; the timeout only bounds a broken run."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.002)


def cli_trackers(daemon: Daemon) -> list[CliTracker]:
    """The process trackers of every ``cli`` adapter instance of the daemon."""
    return [
        backend
        for adapter_set in daemon.adapters._sets.values()
        for backend in adapter_set._backends.values()
        if isinstance(backend, CliTracker)
    ]


def child_pids() -> set[int]:
    """Processes (zombies included) whose parent is this process."""
    me = str(os.getpid())
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as handle:
                stat = handle.read()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces, so split after the last ')'
        fields_after = stat.rpartition(")")[2].split()
        if len(fields_after) > 1 and fields_after[1] == me:
            found.add(int(entry))
    return found


def process_gone(pid: int) -> bool:
    """Whether no process ``pid`` exists any more (a zombie still exists)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def leaks(daemon: Daemon, *, processes: bool = True) -> dict[str, int]:
    """Everything that should be zero once the edge is at rest; any non-zero value is a leak.

    ``unreleased`` is ``admitted - released``; ``unaccounted`` breaks the scheduler's identity
    ``submitted == admitted + sum(rejected) + queue_depth``.
    """
    stats = daemon.scheduler.statistics()
    found = {
        "in_flight": stats.in_flight,
        "queue_depth": stats.queue_depth,
        "unreleased": stats.admitted - stats.released,
        "double_releases": stats.double_releases,
        "unaccounted": stats.submitted - stats.admitted - stats.rejected_total - stats.queue_depth,
        "cli_runs": sum(len(t.runs) + len(t.reapers) for t in cli_trackers(daemon)),
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
        assert daemon.supervisor is not None
        daemon.supervisor._listeners.append(self.records.append)

    @property
    def supervisor(self) -> Supervisor:
        """The daemon's supervisor (always present: the daemon watches a file)."""
        assert self.daemon.supervisor is not None
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
        config_path=path,
        supervisor_options=SupervisorOptions(debounce=0.05, settle=settle, poll_interval=3600),
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
        ("bootstrap enabled", edit(lambda d: d.update(bootstrap={"enabled": True}))),
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


def _records_since(edge: WatchedEdge, start: int) -> Callable[[], bool]:
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


# --- the config fuzzer -----------------------------------------------------------------------


@st.composite
def near_misses(draw: st.DrawFn, base: dict[str, Any]) -> str:
    """YAML text of ``base`` (the running config) with one to three edits of the kinds
    :func:`tests.strategies.mutated_docs` makes (a key deleted, a value replaced by an
    arbitrary YAML value, an unknown key added, a list item duplicated), or a text-level break
    (truncated, a duplicated line, a stray bracket) — what an operator's slip looks like."""
    text = dump(mutate(draw, copy.deepcopy(base)))
    lines = text.splitlines(keepends=True)
    breakage = draw(st.sampled_from(["none", "none", "truncate", "duplicate_line", "bracket"]))
    if breakage == "truncate":
        text = text[: draw(st.integers(0, max(len(text) - 1, 0)))]
    elif breakage == "duplicate_line" and lines:
        at = draw(st.integers(0, len(lines) - 1))
        text = "".join([*lines[: at + 1], lines[at], *lines[at + 1 :]])
    elif breakage == "bracket" and lines:
        at = draw(st.integers(0, len(lines) - 1))
        text = "".join([*lines[:at], lines[at].rstrip("\n") + " [\n", *lines[at + 1 :]])
    return text


def fuzz_texts(
    base: dict[str, Any], count: int, *, derandomize: bool = True, seed: int | None = None
) -> list[str]:
    """Up to ``count`` distinct candidate files, drawn by Hypothesis: half unrelated mutated
    documents (:func:`tests.strategies.mutated_docs`), half near misses of ``base``.

    Drawn up front (the daemon runs on one event loop for the whole run, which Hypothesis'
    per-example runner cannot share); derandomized for the test suite, seeded for the soak.
    """
    seen: set[str] = {dump(base)}
    unrelated = _collect(mutated_docs().map(dump), count // 2, seen, derandomize, seed)
    near = _collect(near_misses(base).filter(_invalid), count - count // 2, seen, derandomize, seed)
    return [text for pair in zip(unrelated, near, strict=False) for text in pair] + (
        unrelated[len(near) :] + near[len(unrelated) :]
    )


def _invalid(text: str) -> bool:
    """Whether the loader refuses ``text`` (near misses are kept only then: a valid one could
    legitimately take the load's model away, and the fuzzer asserts zero failed requests)."""
    try:
        load_config(text)
    except ConfigError:
        return True
    return False


def _collect(
    strategy: st.SearchStrategy[str],
    count: int,
    seen: set[str],
    derandomize: bool,
    seed: int | None,
) -> list[str]:
    found: list[str] = []

    @settings(
        max_examples=count,
        derandomize=derandomize,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        deadline=None,
    )
    @given(strategy)
    def collect(text: str) -> None:
        if text not in seen:
            seen.add(text)
            found.append(text)

    if seed is not None and not derandomize:
        collect = hypothesis_seed(seed)(collect)
    collect()
    return found


@dataclass
class FuzzReport:
    """What the config fuzzer did and saw."""

    candidates: int = 0
    rejected: int = 0
    applied: int = 0
    restart_required: int = 0
    unnamed_errors: list[str] = field(default_factory=list)
    running_changed_on_rejection: int = 0
    requests_ok: int = 0
    request_failures: list[str] = field(default_factory=list)
    leaks: dict[str, int] = field(default_factory=dict)
    still_serving: bool = False


async def run_config_fuzz(
    edge: WatchedEdge, texts: Sequence[str], load: SteadyLoad, *, restore: str
) -> FuzzReport:
    """Save each candidate to the watched file while ``load`` flows and wait for the daemon's
    verdict; after an accepted candidate, save ``restore`` (the base file) again so the next
    one is judged against the same running config. Stops the load and checks for leaks."""
    report = FuzzReport()
    for text in texts:
        before = len(edge.records)
        hash_before = edge.supervisor.running_hash
        rename_save(edge.path, text)
        await wait_for(_records_since(edge, before))
        result: RefreshResult = edge.records[before].result
        report.candidates += 1
        if result.result == "rejected":
            report.rejected += 1
            if edge.supervisor.running_hash != hash_before:
                report.running_changed_on_rejection += 1
            for error in result.errors:
                if not error_names_a_path(error.path, error.message):
                    report.unnamed_errors.append(f"{error.message!r} for {text[:80]!r}")
        else:
            report.applied += result.result == "applied"
            report.restart_required += result.result == "restart_required"
            again = len(edge.records)
            rename_save(edge.path, restore)
            await wait_for(_records_since(edge, again))
        await load.progress(1)
    await load.stop()
    report.requests_ok, report.request_failures = load.ok, list(load.failures)
    with contextlib.suppress(AssertionError):
        await settled(edge.daemon)
    report.leaks = {k: v for k, v in leaks(edge.daemon).items() if v}
    async with openai.AsyncOpenAI(
        base_url=edge.daemon.openai_url, api_key="x", max_retries=0
    ) as client:
        reply = await client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "still here"}]
        )
        report.still_serving = reply.choices[0].message.content == "still here"
    return report


# --- hostile clients and upstreams (issue 10) ------------------------------------------------


@dataclass
class EdgeProcess:
    """``iop-edge serve`` running as a subprocess: every stderr line it wrote so far, and the
    addresses of its ``listening`` event (``openai``, ``console``, ``metrics``)."""

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
    within :data:`BOUND`; afterwards :attr:`EdgeProcess.lines` holds its whole log (stderr)."""
    process = subprocess.Popen(
        [str(Path(sys.executable).with_name("iop-edge")), "serve", "--config", str(config)],
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
                    addresses.update(
                        {k: v for k, v in event.items() if k in ("openai", "console", "metrics")}
                    )
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


async def raw_exchange(host: str, port: int, request: bytes) -> tuple[int, bytes]:
    """Send ``request`` (whole, as bytes: a client no library would let us be) on a new
    connection and read the answer to the end; the status and the body."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(BOUND):
            raw = await reader.read()
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split(b" ")
    return int(status_line[1]), body


def raw_request(
    method: str,
    path: str,
    headers: Sequence[tuple[bytes, bytes]] = (),
    body: bytes = b"",
    *,
    host: bytes = b"127.0.0.1",
) -> bytes:
    """An HTTP/1.1 request built byte by byte (header values may hold any byte), with
    ``Connection: close`` and the body's ``Content-Length``."""
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: " + host]
    lines += [name + b": " + value for name, value in headers]
    if body or method == "POST":
        lines.append(b"Content-Length: %d" % len(body))
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


@dataclass
class RawUpstream:
    """A loopback upstream that answers every request with the same raw bytes
    (see :func:`raw_upstream`); it counts requests and connections still open."""

    base_url: str
    requests: int = 0
    open_connections: int = 0


@contextlib.asynccontextmanager
async def raw_upstream(response: bytes) -> AsyncIterator[RawUpstream]:
    """An upstream that speaks just enough HTTP/1.1 to read requests (headers and a
    ``Content-Length`` body), and answers each with ``response`` verbatim — a status line no
    framework would send (``101``, ``999``), a redirect, an HTML error page — keeping the
    connection open until the client closes it."""
    writers: set[asyncio.StreamWriter] = set()
    upstream = RawUpstream("")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.add(writer)
        upstream.open_connections += 1
        try:
            while True:  # keep-alive: the client may send the next request on this connection
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                upstream.requests += 1
                writer.write(response)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            upstream.open_connections -= 1
            writers.discard(writer)
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    upstream.base_url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield upstream
    finally:
        server.close()
        for writer in list(writers):
            writer.close()
        await server.wait_closed()


@dataclass
class RawAnswer:
    """One HTTP/1.1 answer read off a raw socket: status, headers (lower-case names), body."""

    status: int
    headers: dict[str, str]
    body: bytes


async def read_answer(reader: asyncio.StreamReader) -> RawAnswer:
    """Read one answer (head, then a ``Content-Length`` body, or the rest until EOF) from a
    connection on which the request was sent; bounded by :data:`BOUND`."""
    async with asyncio.timeout(BOUND):
        head = await reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers: dict[str, str] = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            if name:
                headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
        else:
            body = await reader.read()
    return RawAnswer(int(status_line.split(" ")[1]), headers, body)


async def raw_answer(host: str, port: int, request: bytes) -> RawAnswer:
    """Send ``request`` on a new connection and read its answer with its headers (what
    :func:`raw_exchange` gives, and the headers: ``Retry-After``, ``Connection``, ...)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        await writer.drain()
        return await read_answer(reader)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the peer sends until it closes the connection (EOF or reset); raises
    TimeoutError when it has not closed within :data:`BOUND`."""
    received = b""
    async with asyncio.timeout(BOUND):
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(65536):
                received += chunk
    return received


@dataclass
class Trickled:
    """What a slowloris connection saw: seconds from the moment it started connecting until
    the edge closed it (so never less than the edge's timeout), how many bytes it trickled,
    and what the edge sent it after ``first``'s answer."""

    seconds: float
    sent: int
    received: bytes


async def slowloris(
    host: str, port: int, head: bytes, *, pace: float, first: bytes = b"", at_once: bytes = b""
) -> Trickled:
    """A slowloris client: on a new connection (after ``first``, a whole request whose answer
    is read, when given, and ``at_once``, bytes sent in one go: a complete head whose body is
    then trickled) send ``head`` — an incomplete request head, or part of a body — one byte
    every ``pace`` seconds, then padding, until the edge closes the connection.

    The pace is the attack's own rhythm, not a synchronisation: the test waits on the close
    (bounded by :data:`BOUND`, so an edge that never closes fails the test instead of hanging).
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    reader, writer = await asyncio.open_connection(host, port)
    sent = 0

    async def trickle() -> None:
        nonlocal sent
        data = head
        with contextlib.suppress(ConnectionError):
            while True:
                if sent >= len(data):
                    data += b"a" * 64  # a header value that never ends
                writer.write(data[sent : sent + 1])
                sent += 1
                await writer.drain()
                await asyncio.sleep(pace)

    try:
        if first:
            writer.write(first)
            await writer.drain()
            answer = await read_answer(reader)
            assert answer.status == 200, answer
        if at_once:
            writer.write(at_once)
            await writer.drain()
        trickling = asyncio.create_task(trickle())
        try:
            received = await until_closed(reader)
        finally:
            trickling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await trickling
        return Trickled(loop.time() - started, sent, received)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def stalled_reader(host: str, port: int, request: bytes) -> socket.socket:
    """A client that sends ``request`` and then never reads: a blocking socket with a small
    receive buffer (so the edge's writes have to wait soon). The caller closes it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(BOUND)
    sock.connect((host, port))
    sock.sendall(request)
    return sock


def read_until_closed(sock: socket.socket) -> tuple[bytes, str]:
    """Read a blocking socket until the peer closes it: the bytes, and ``"eof"`` or
    ``"reset"``; raises TimeoutError when it stays open past :data:`BOUND`."""
    received = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return received, "reset"
        if not chunk:
            return received, "eof"
        received += chunk


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
        fields_after = stat.rpartition(")")[2].split()
        if len(fields_after) > 1 and fields_after[1] == str(pid):
            found[int(entry)] = cmdline
    return found


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
    """What ``/admin/status`` shows still held: slots in flight, the queue, admissions not
    released, double releases. Empty when the edge is at rest."""
    counters = status["counters"]
    held = {
        "in_flight": sum(p["in_flight"] for p in status["providers"]),
        "queue_depth": status["queue"]["depth"],
        "unreleased": counters["admitted"] - counters["released"],
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


class ThreadedUpstream:
    """A loopback HTTP/1.1 upstream served by threads rather than an event loop, so that one
    daemon (say, a module's) can use it across tests, each with its own loop.

    Built with :meth:`answering` (every request gets the same raw bytes, the connection kept
    until the client closes it) or :meth:`endless` (a 200 event stream of ``frame`` repeated
    until the client goes; :attr:`streams_open` counts streams being written, so a test sees
    the edge let go of its upstream). Use as a context manager.
    """

    def __init__(self, respond: Callable[[socket.socket], None]) -> None:
        self._respond = respond
        self._server = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.base_url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self.requests = 0
        self.streams_open = 0
        self.streams_ended = 0
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._acceptor = threading.Thread(target=self._accept, daemon=True)

    @classmethod
    def answering(cls, raw: bytes) -> ThreadedUpstream:
        """An upstream answering every request with ``raw``, verbatim."""

        def respond(conn: socket.socket) -> None:
            conn.sendall(raw)

        return cls(respond)

    @classmethod
    def endless(cls, frame: bytes) -> ThreadedUpstream:
        """An upstream whose every answer is an event stream of ``frame``, forever."""
        upstream: ThreadedUpstream

        def respond(conn: socket.socket) -> None:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
            with upstream._lock:
                upstream.streams_open += 1
            try:
                while True:
                    conn.sendall(frame)
            finally:
                with upstream._lock:
                    upstream.streams_open -= 1
                    upstream.streams_ended += 1

        upstream = cls(respond)
        return upstream

    def __enter__(self) -> ThreadedUpstream:
        self._acceptor.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        self._acceptor.join(BOUND)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                self._connections.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buffered = b""
        try:
            while True:  # keep-alive: the edge may send its next request on this connection
                while b"\r\n\r\n" not in buffered:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffered += chunk
                head, _, buffered = buffered.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buffered) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffered += chunk
                buffered = buffered[length:]
                with self._lock:
                    self.requests += 1
                self._respond(conn)
        except OSError:
            pass
        finally:
            with self._lock:
                self._connections.discard(conn)
            conn.close()


@contextlib.contextmanager
def silent_upstream() -> Iterator[str]:
    """An upstream that never answers: a listening socket nobody accepts from. The kernel
    completes the edge's connections (the backlog holds 64) and buffers its requests; the
    edge then waits for an answer that never comes. Yields its base URL."""
    server = socket.create_server(("127.0.0.1", 0), backlog=64)
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()


def split_save(path: Path, first: str, second: str, *, pause: float) -> None:
    """Save ``first + second`` in place the way a slow writer does: truncate, write and flush
    ``first``, wait ``pause`` seconds, write ``second``. The pause is the point of the attack
    (a watcher sees the file between the two writes), not a synchronisation."""
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(first)
        handle.flush()
        os.fsync(handle.fileno())
        time.sleep(pause)
        handle.write(second)


def swap_in_fifo(path: Path) -> None:
    """Replace the file at ``path`` by a FIFO (named pipe) with no writer, atomically."""
    tmp = path.with_name(f".{path.name}.fifo")
    os.mkfifo(tmp)
    os.replace(tmp, path)


async def config_validate(path: Path) -> tuple[int, str]:
    """``iop-edge config validate PATH`` as an operator runs it: its exit code and its output
    (stdout + stderr); a run that does not end within :data:`BOUND` is killed and fails."""
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("iop-edge")),
        "config",
        "validate",
        str(path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(BOUND):
            out, _ = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError(f"config validate {path} did not end within {BOUND} s") from None
    assert process.returncode is not None
    return process.returncode, out.decode(errors="replace")
