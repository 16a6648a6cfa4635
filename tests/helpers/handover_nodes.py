"""Restarts of either side of a node link, with real processes (issue 29 items 7 and 8): an
``iop-edge serve`` lineage (the first process and those its handovers start, all writing to
one stderr; :class:`EdgeLineage`), driven as an operator drives it (``iop-edge restart``,
``iop-edge config refresh``, ``iop-edge status``'s ``/admin/status``), a remote node's config
(:func:`remote_doc`) and the official ``openai`` SDK as the client (:func:`chat`,
:func:`stream_chat`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp
import openai

from iop_edge.testing.leaks import wait_for
from iop_edge.testing.node_process import NodeProcess, node_process
from iop_edge.tokens import token_hash
from tests.helpers import BOUND, IOP_EDGE
from tests.helpers.service import Served, served, write_config

NODE: Final = "gpu"
PROVIDER: Final = "far"
MODEL: Final = "chat"
NODE_TOKEN: Final = "iopn_handover-test-token-never-logged"
"""The node's token (a test asserts it appears in no log line of either side)."""
OTHER_TOKEN: Final = "iopn_rotated-token-the-node-does-not-hold"
HEARTBEAT_MS: Final = 500
"""Short enough that a link is known up soon; long enough that a loaded machine does not let
a link go silent for three heartbeats."""


def remote_doc(base_url: str, *, token: str = NODE_TOKEN, **provider: Any) -> dict[str, Any]:
    """An edge whose model ``chat`` is served by remote node ``gpu`` alone: provider ``far``
    (capacity 4 unless ``provider`` says otherwise) on an ``openai_compat`` adapter at
    ``base_url``, which only the node calls. The node listener on 127.0.0.1 (port 0), the
    file watch off (a test refreshes when it chooses), JSON logs."""
    return {
        "openai": {"listen": "127.0.0.1:0"},
        "metrics": {"listen": "127.0.0.1:0"},
        "console": {"listen": "127.0.0.1:0"},
        "listen": {"address": "127.0.0.1:0"},
        "bootstrap": {"heartbeat_ms": HEARTBEAT_MS},
        "reload": {"watch": False},
        "provider_pool": {"max_queue": 64, "queue_timeout_ms": 30000},
        "models": [{"id": MODEL, "context_window_tokens": 4096, "providers": [PROVIDER]}],
        "nodes": [
            {
                "id": NODE,
                "token_hash_sha256": token_hash(token),
                "adapters": [{"name": "oa", "type": "openai_compat", "base_url": base_url}],
                "providers": [
                    {
                        "id": PROVIDER,
                        "type": "openai_compat",
                        "category": "api",
                        "adapter": "oa",
                        "models": ["fake-model"],
                        "capacity": 4,
                        **provider,
                    }
                ],
            }
        ],
    }


def with_provider(doc: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """``doc`` with provider ``far``'s ``fields`` replaced (a copy)."""
    doc = json.loads(json.dumps(doc))
    doc["nodes"][0]["providers"][0].update(fields)
    return doc


def with_adapter(doc: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """``doc`` with adapter ``oa``'s ``fields`` replaced (a copy)."""
    doc = json.loads(json.dumps(doc))
    doc["nodes"][0]["adapters"][0].update(fields)
    return doc


def write_token(directory: Path, token: str = NODE_TOKEN) -> Path:
    """The node's token file (mode 0600, as ``iop-edge token node`` tells)."""
    path = directory / "node-token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


def exited(pid: int) -> bool:
    """Whether process ``pid`` ended (gone, or a zombie: a successor is not our child)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


@dataclass
class EdgeLineage:
    """``iop-edge serve --no-parent`` and the processes its handovers start: they serve on the
    same listening sockets (``openai``, ``console``, ``metrics``, ``nodes``: their URLs) and
    write to the same stderr (:attr:`served`'s log holds every process's lines)."""

    served: Served
    config: Path
    urls: dict[str, str]
    #: the pid of every process that served, the first one's first
    pids: list[int] = field(default_factory=list)

    @property
    def first(self) -> subprocess.Popen[str]:
        """The first process (the test's child: its exit status can be read)."""
        return self.served.process

    def edit(self, doc: dict[str, Any]) -> None:
        """Save ``doc`` as the config file (the running process reads it when told)."""
        write_config(self.config.parent, doc)

    def events(self, name: str) -> list[dict[str, Any]]:
        """The lines ``name`` that any process of the lineage logged so far."""
        return self.served.events(name)

    async def wait_event(
        self, name: str, predicate: Callable[[dict[str, Any]], bool] = lambda e: True
    ) -> dict[str, Any]:
        """The first line ``name`` of any process for which ``predicate`` holds, once logged
        (bounded by :data:`BOUND`)."""

        def found() -> dict[str, Any] | None:
            return next((e for e in self.events(name) if predicate(e)), None)

        try:
            await wait_for(lambda: found() is not None)
        except TimeoutError:
            raise AssertionError(f"no {name!r} line came:\n{self.served.log}") from None
        line = found()
        assert line is not None
        return line

    async def status(self) -> dict[str, Any]:
        """``/admin/status`` of the process serving now (a new connection each time: a kept
        alive one may still reach an old process)."""
        async with (
            aiohttp.ClientSession() as session,
            session.get(self.urls["console"] + "/admin/status") as answer,
        ):
            assert answer.status == 200, await answer.text()
            return dict(await answer.json())

    async def node(self) -> dict[str, Any]:
        """Node ``gpu`` as the serving process's status shows it."""
        return next(n for n in (await self.status())["nodes"] if n["id"] == NODE)

    async def provider(self) -> dict[str, Any]:
        """Provider ``far`` as the serving process's status shows it."""
        return next(p for p in (await self.status())["providers"] if p["id"] == PROVIDER)

    async def command(self, *args: str) -> tuple[int, dict[str, Any]]:
        """``iop-edge ARGS --console URL --json`` (the serving process's admin API): its exit
        code and its JSON answer."""
        done = await asyncio.to_thread(
            subprocess.run,
            [IOP_EDGE, *args, "--console", self.urls["console"], "--json"],
            capture_output=True,
            text=True,
            timeout=BOUND,
            check=False,
        )
        assert done.stdout, done.stderr
        return done.returncode, dict(json.loads(done.stdout))

    async def restart(self) -> dict[str, Any]:
        """``iop-edge restart``: the handover, which must succeed; its answer (the new
        process's ``pid``), once the new process serves."""
        code, answer = await self.command("restart")
        assert (code, answer["result"]) == (0, "handed_over"), answer
        self.pids.append(answer["pid"])
        return answer

    async def refresh(self) -> tuple[int, dict[str, Any]]:
        """``iop-edge config refresh --apply``: the serving process reads its file."""
        return await self.command("config", "refresh", "--apply")

    async def stop(self) -> None:
        """SIGTERM to the serving process; it must exit 0 (the first process: its status),
        or be gone (a successor)."""
        pid = self.pids[-1]
        os.kill(pid, signal.SIGTERM)
        if pid == self.first.pid:
            assert await asyncio.to_thread(self.served.exit_code) == 0, self.served.log
        else:
            await wait_for(lambda: exited(pid))
        await wait_for(lambda: len(self.events("stopped")) == len(self.pids))


@contextlib.asynccontextmanager
async def edge_lineage(directory: Path, doc: dict[str, Any]) -> AsyncIterator[EdgeLineage]:
    """``iop-edge serve --no-parent`` of ``doc`` (written to ``directory/edge.yaml``), as an
    operator runs it, once it logs ``listening``; stopped (SIGTERM, exit 0) afterwards, and
    whatever is left of its process group killed."""
    config = write_config(directory, doc)
    with served(config, "--no-parent") as process:
        listening = await asyncio.to_thread(process.wait_event, "listening")
        urls = {name: listening[name] for name in ("openai", "console", "metrics", "nodes")}
        lineage = EdgeLineage(process, config, urls, [process.process.pid])
        yield lineage
        await lineage.stop()


@contextlib.asynccontextmanager
async def remote_node(
    edge: EdgeLineage, token_file: Path, *, expect_exit: int | None = 0
) -> AsyncIterator[NodeProcess]:
    """``iop-node`` dialling ``edge``'s node listener with ``token_file``, yielded once the
    serving process shows it connected; SIGTERM afterwards (exit ``expect_exit``)."""
    args = ("--edge", edge.urls["nodes"], "--token-file", str(token_file))
    async with node_process(*args, expect_exit=expect_exit) as node:
        await node.wait_for_log("node_connected")
        await wait_for(lambda: connected(edge))
        yield node


async def connected(edge: EdgeLineage) -> bool:
    """Whether the serving process shows node ``gpu`` connected."""
    return bool((await edge.node())["connected"])


def client(edge: EdgeLineage) -> openai.AsyncOpenAI:
    """The official SDK on the edge's OpenAI listener; no retries (a failure must show)."""
    return openai.AsyncOpenAI(
        base_url=edge.urls["openai"] + "/v1", api_key="unused", max_retries=0, timeout=BOUND
    )


async def chat(sdk: openai.AsyncOpenAI, text: str) -> str:
    """One chat completion of model ``chat``: its answer's text."""
    answer = await sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": text}]
    )
    return answer.choices[0].message.content or ""


async def stream_chat(
    sdk: openai.AsyncOpenAI, text: str, begun: asyncio.Event | None = None
) -> str:
    """One streamed chat completion of model ``chat``, read to its end: the text its chunks
    carried (``begun`` is set once the first chunk came). A stream that ends with the API's
    error event raises."""
    pieces: list[str] = []
    stream = await sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": text}], stream=True
    )
    async for chunk in stream:
        if begun is not None:
            begun.set()
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    return "".join(pieces)


async def keep_asking(
    sdk: openai.AsyncOpenAI, name: str, stop: asyncio.Event, outcomes: list[str]
) -> None:
    """A client loop: its next chat as soon as the last is answered, until ``stop``; each
    outcome recorded (``ok``, or the error that a user would have seen)."""
    i = 0
    while not stop.is_set():
        text = f"{name} asks {i}"
        try:
            answer = await chat(sdk, text)
        except openai.OpenAIError as exc:
            outcomes.append(f"{text}: {exc!r}")
        else:
            outcomes.append("ok" if answer == text else f"{text}: answered {answer!r}")
        i += 1


async def outcome(request: Awaitable[str]) -> str:
    """What ``request`` (a :func:`chat` or :func:`stream_chat`) answered, or the error a user
    would have seen, as text (so a failure shows in the test's assertion, request by
    request)."""
    try:
        return await request
    except openai.OpenAIError as exc:
        return f"failed: {exc!r}"
