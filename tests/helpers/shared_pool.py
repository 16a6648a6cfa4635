"""Several ``iop-edge serve`` processes sharing one pool through a real ``redis-server`` (the
end-to-end tests of ``provider_pool.shared``): their config (:func:`shared_doc`), starting
them side by side (:func:`serving_edges`), and a concurrent client that spreads mixed
streaming and plain chat requests over them and keeps every outcome (:class:`Load`).

The client is ``aiohttp`` speaking the OpenAI chat protocol as any client does: a plain answer
is a ``chat.completion`` whose text is the prompt's echo; a stream is ``chat.completion.chunk``
events whose text joins to the echo, ending in ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import subprocess
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp
import orjson

from iop_edge.testing.edge_process import EdgeProcess, edge_process
from iop_edge.testing.fake_openai import FakeOpenAI
from iop_edge.testing.leaks import BOUND
from iop_edge.testing.reload_storm import dump
from iop_edge.tokens import token_hash

__all__ = [
    "CAPACITY",
    "Load",
    "Outcome",
    "ask",
    "serving_edges",
    "shared_doc",
]

CAPACITY: Final = 4
"""The one provider's ``capacity``, held across every edge."""

MODEL: Final = "chat"


def shared_doc(
    fake: FakeOpenAI,
    store: str,
    *,
    lease_ttl_ms: int,
    on_store_down: str = "static_split",
    max_queue: int = 64,
    tokens: Mapping[str, str] | None = None,
    principals: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """An edge whose model ``chat`` has one provider (``local/up``, openai_compat, capacity
    :data:`CAPACITY`) on ``fake``, its pool shared through ``store``; ``tokens`` maps each
    principal to its bearer token (none: anonymous), ``principals`` are
    ``provider_pool.principals`` entries."""
    openai: dict[str, Any] = {"listen": "127.0.0.1:0"}
    if tokens:
        openai["principal_tokens"] = [
            {"token_ref": ref, "token_hash_sha256": token_hash(raw), "principal_ref": ref}
            for ref, raw in tokens.items()
        ]
    pool: dict[str, Any] = {
        "max_queue": max_queue,
        "queue_timeout_ms": 30000,
        "shared": {"store": store, "lease_ttl_ms": lease_ttl_ms, "on_store_down": on_store_down},
    }
    if principals:
        pool["principals"] = [dict(p) for p in principals]
    return {
        "openai": openai,
        "metrics": {"listen": "127.0.0.1:0"},
        "console": {"listen": "127.0.0.1:0"},
        "provider_pool": pool,
        "models": [{"id": MODEL, "context_window_tokens": 4096, "providers": ["up"]}],
        "nodes": [
            {
                "id": "local",
                "adapters": [{"name": "oa", "type": "openai_compat", "base_url": fake.base_url}],
                "providers": [
                    {
                        "id": "up",
                        "type": "openai_compat",
                        "category": "local_inference",
                        "adapter": "oa",
                        "models": ["fake-model"],
                        "capacity": CAPACITY,
                        "health_check": False,
                    }
                ],
            }
        ],
    }


@contextlib.asynccontextmanager
async def serving_edges(
    directory: Path, doc: Mapping[str, Any], count: int
) -> AsyncIterator[list[EdgeProcess]]:
    """``count`` edges from the same config, started side by side off the loop (the fake
    upstream it serves keeps answering); at the end each gets SIGTERM and must exit 0 within
    :data:`BOUND` — one the test killed is only reaped."""
    config = directory / "edge.yaml"
    config.write_text(dump(dict(doc)))
    running = [edge_process(config) for _ in range(count)]
    started = await asyncio.gather(
        *(asyncio.to_thread(r.__enter__) for r in running), return_exceptions=True
    )
    pairs = [(r, e) for r, e in zip(running, started, strict=True) if isinstance(e, EdgeProcess)]

    async def stop_all() -> list[BaseException]:
        ended = await asyncio.gather(*(_stop(r, e) for r, e in pairs), return_exceptions=True)
        return [e for e in ended if isinstance(e, BaseException)]

    failed = [e for e in started if isinstance(e, BaseException)]
    if failed:
        await stop_all()
        raise failed[0]
    try:
        yield [e for _, e in pairs]
    except BaseException:
        await stop_all()
        raise
    errors = await stop_all()
    if errors:
        raise errors[0]


async def _stop(manager: contextlib.AbstractContextManager[EdgeProcess], edge: EdgeProcess) -> None:
    if edge.process.poll() is not None:  # (killed by the test: nothing to stop)
        with contextlib.suppress(AssertionError, ProcessLookupError):
            await asyncio.to_thread(manager.__exit__, None, None, None)
        return
    try:
        await asyncio.to_thread(manager.__exit__, None, None, None)
    except subprocess.TimeoutExpired as exc:
        tail = "".join(edge.lines[-40:])
        raise AssertionError(
            f"an edge did not stop within {BOUND:g} s of SIGTERM:\n{tail}"
        ) from exc


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one request ended, as its client saw it: ``status`` (``None``: no answer, the
    connection failed — ``error`` names the exception), the error envelope's ``code``, the
    ``Retry-After`` header, and whether a 200 carried the whole echo (a stream: to
    ``[DONE]``)."""

    edge: int
    stream: bool
    status: int | None
    code: str | None = None
    retry_after: str | None = None
    complete: bool = False
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.complete


async def ask(
    session: aiohttp.ClientSession,
    edge: EdgeProcess,
    index: int,
    prompt: str,
    *,
    stream: bool,
    token: str | None = None,
) -> Outcome:
    """One chat request to ``edge`` (number ``index``), read to its end."""
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "stream": stream,
    }
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    url = edge.addresses["openai"] + "/v1/chat/completions"
    expected = prompt.split("]]", 1)[-1].strip()
    try:
        async with session.post(url, data=orjson.dumps(body), headers=headers) as response:
            raw = await response.read()
            if response.status != 200:
                try:
                    code = orjson.loads(raw)["error"]["code"]
                except (ValueError, KeyError, TypeError):
                    code = "(not the OpenAI error envelope)"
                return Outcome(
                    index,
                    stream,
                    response.status,
                    code=code,
                    retry_after=response.headers.get("Retry-After"),
                )
            text = _streamed(raw) if stream else _plain(raw)
            return Outcome(index, stream, 200, complete=text == expected)
    except (aiohttp.ClientError, ConnectionError, TimeoutError) as exc:
        return Outcome(index, stream, None, error=type(exc).__name__)


def _plain(raw: bytes) -> str | None:
    answer = orjson.loads(raw)
    if answer.get("object") != "chat.completion":
        return None
    return str(answer["choices"][0]["message"]["content"])


def _streamed(raw: bytes) -> str | None:
    """The text of a chat stream, or ``None`` when it does not end in ``[DONE]`` or carries an
    error event."""
    events = [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]
    if not events or events[-1] != "[DONE]":
        return None
    text = ""
    for event in events[:-1]:
        chunk = orjson.loads(event)
        if "error" in chunk:
            return None
        for choice in chunk.get("choices", ()):
            text += choice.get("delta", {}).get("content") or ""
    return text


@dataclass
class Load:
    """A concurrent client: ``per_edge`` requests in flight on each edge it drives, streaming
    and plain in turn, until :meth:`stop` (or, on one edge, :meth:`stop_edge`); every
    :class:`Outcome` kept in order of completion."""

    edges: Sequence[EdgeProcess]
    per_edge: int
    token: str | None = None
    outcomes: list[Outcome] = field(default_factory=list)
    _done_by: Counter[int] = field(default_factory=Counter)
    _stopped: set[int] = field(default_factory=set)
    _all_stopped: bool = False
    _tasks: dict[int, list[asyncio.Task[None]]] = field(default_factory=dict)
    _counter: itertools.count[int] = field(default_factory=itertools.count)
    _session: aiohttp.ClientSession | None = None
    _waiters: list[tuple[Callable[[], bool], asyncio.Future[None]]] = field(default_factory=list)

    async def __aenter__(self) -> Load:
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=BOUND)
        )
        for index in range(len(self.edges)):
            self._tasks[index] = [
                asyncio.create_task(self._worker(index)) for _ in range(self.per_edge)
            ]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._all_stopped = True
        tasks = [t for ts in self._tasks.values() for t in ts]
        try:
            async with asyncio.timeout(BOUND):
                await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            assert self._session is not None
            await self._session.close()

    async def _worker(self, index: int) -> None:
        assert self._session is not None
        while not self._all_stopped and index not in self._stopped:
            n = next(self._counter)
            outcome = await ask(
                self._session,
                self.edges[index],
                index,
                f"edge {index} request {n}",
                stream=n % 2 == 0,
                token=self.token,
            )
            self.outcomes.append(outcome)
            self._done_by[index] += 1
            if outcome.status is None:
                self._stopped.add(index)  # (the edge is gone: its worker ends)
            self._notify()

    async def stop_edge(self, index: int) -> None:
        """Send no more to edge ``index``; return once its requests have ended."""
        self._stopped.add(index)
        await asyncio.gather(*self._tasks[index])

    def stop(self) -> None:
        """Send no more requests (those in flight end as they do)."""
        self._all_stopped = True

    def done(self, edge: int | None = None) -> int:
        """Requests ended so far (on edge ``edge`` only, when given)."""
        return len(self.outcomes) if edge is None else self._done_by[edge]

    async def until(self, predicate: Callable[[], bool]) -> None:
        """Return once ``predicate()`` holds, checked at each request's end (bounded by
        :data:`BOUND`)."""
        if predicate():
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((predicate, future))
        async with asyncio.timeout(BOUND):
            await future

    async def more(self, count: int) -> None:
        """Return once ``count`` more requests have ended."""
        target = self.done() + count
        await self.until(lambda: self.done() >= target)

    def _notify(self) -> None:
        pending = []
        for predicate, future in self._waiters:
            if future.done():
                continue
            if predicate():
                future.set_result(None)
            else:
                pending.append((predicate, future))
        self._waiters = pending
