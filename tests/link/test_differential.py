"""A remote provider answers exactly like the same provider local (issue 29 items 1, 4, 5, 9,
11), with real processes on 127.0.0.1: ``iop-edge serve``, whose node ``here`` is local and
node ``far`` remote, served by an ``iop-node`` subprocess; both nodes run the same three
providers (``openai_compat``, ``ollama``, ``cli``) on the same fake upstreams, so every
request asked of ``{kind}-here`` and of ``{kind}-far`` must get the same answer — bodies equal
but for their ids and times, streams equal event for event, usage equal — through the official
``openai`` and ``anthropic`` SDKs. The edge counts a remote request as it counts a local one.

The node dials through a :class:`~tests.helpers.remote_e2e.LinkTap`, which keeps every byte
the node received: its payload is its own node's and nothing else (item 9), and neither
process ever logs the node's token.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import anthropic
import openai
import pytest
import pytest_asyncio
from openai.types.chat import ChatCompletionFunctionToolParam

from iop_edge.config import load_config
from iop_edge.config.payload import node_payload, payload_generation
from iop_edge.link.protocol import Kind
from iop_edge.testing.edge_process import (
    EdgeProcess,
    edge_at_rest,
    edge_metrics,
    log_events,
    wait_for_log,
)
from iop_edge.testing.fake_ollama import FakeOllama
from iop_edge.testing.fake_openai import FakeOpenAI
from iop_edge.testing.leaks import children_of
from iop_edge.testing.node_process import NodeProcess
from iop_edge.tokens import token_hash
from tests.helpers import FAKE_CLI, dump, wait_for
from tests.helpers.remote_e2e import (
    LinkTap,
    joined_node,
    link_frames,
    node_status,
    normalized,
    remote_node,
    serving_edge,
    wait_status,
    without,
    write_token,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

FAR_TOKEN: Final = "iopn_differential-far-3c9e1a7b5d2f4086"
SPARE_TOKEN: Final = "iopn_differential-spare-8b1d6f0e2a4c7395"
APP_TOKEN: Final = "iop_differential-app-51e07c2d9a4b8f36"
SPARE_SECRET: Final = "sk-spare-node-credential-6d2a90f1"
KINDS: Final = ("oa", "ol", "cli")
SURFACES: Final = (
    "chat",
    "chat-stream",
    "messages",
    "messages-stream",
    "responses",
    "responses-stream",
)
PROMPT: Final = "Tell the differential test what the remote node heard"


def providers(where: str) -> list[dict[str, Any]]:
    """The three providers of node ``where`` (``here`` or ``far``): ``oa-…``, ``ol-…``,
    ``cli-…``, the same on both nodes but for their ids."""
    return [
        {
            "id": f"oa-{where}",
            "type": "openai_compat",
            "category": "local_inference",
            "adapter": "oa",
            "models": ["fake-model"],
            "capacity": 4,
        },
        {
            "id": f"ol-{where}",
            "type": "ollama",
            "category": "local_inference",
            "adapter": "ol",
            "models": ["fake-model"],
            "capacity": 4,
        },
        {
            "id": f"cli-{where}",
            "type": "cli",
            "category": "cli",
            "adapter": "agent",
            "models": ["agent"],
            "capacity": 4,
            "args": [*FAKE_CLI[1:], "--format", "stream-json"],
            "output_format": "stream-json",
            "request_timeout_ms": 20000,
        },
    ]


def differential_doc(oa_url: str, ol_url: str) -> dict[str, Any]:
    """Local node ``here`` and remote node ``far`` with the same adapters and providers;
    model ``{kind}-{where}`` served by provider ``{kind}-{where}`` alone. A second remote node,
    ``spare`` (never connected), has a credential of its own: ``far`` must never see it."""
    adapters = [
        {"name": "oa", "type": "openai_compat", "base_url": oa_url},
        {"name": "ol", "type": "ollama", "base_url": ol_url},
        {"name": "agent", "type": "cli", "command": FAKE_CLI[0]},
    ]
    spare_adapter = {
        "name": "vault",
        "type": "openai_compat",
        "base_url": "http://10.77.0.2/v1",
        "headers": {"Authorization": f"Bearer {SPARE_SECRET}"},
    }
    spare_provider = {
        "id": "spare-oa",
        "type": "openai_compat",
        "category": "api",
        "adapter": "vault",
        "models": ["vault-model"],
    }
    models = [
        {"id": f"{kind}-{where}", "context_window_tokens": 4096, "providers": [f"{kind}-{where}"]}
        for kind in KINDS
        for where in ("here", "far")
    ]
    models.append({"id": "spare", "context_window_tokens": 4096, "providers": ["spare-oa"]})
    return {
        "logging": {"level": "debug"},
        "openai": {
            "listen": "127.0.0.1:0",
            "principal_tokens": [
                {
                    "token_ref": "diff-app",
                    "principal_ref": "diff-team",
                    "token_hash_sha256": token_hash(APP_TOKEN),
                }
            ],
        },
        "metrics": {"listen": "127.0.0.1:0"},
        "console": {"listen": "127.0.0.1:0"},
        "listen": {"address": "127.0.0.1:0"},
        "bootstrap": {"heartbeat_ms": 1000},
        "provider_pool": {"max_queue": 7, "queue_timeout_ms": 20000},
        "models": models,
        "nodes": [
            {"id": "here", "adapters": adapters, "providers": providers("here")},
            remote_node("far", FAR_TOKEN, adapters, providers("far")),
            remote_node("spare", SPARE_TOKEN, [spare_adapter], [spare_provider]),
        ],
    }


@dataclass
class Differential:
    """The edge, its remote node ``far`` (dialled through :attr:`tap`) and the config."""

    edge: EdgeProcess
    node: NodeProcess
    tap: LinkTap
    doc: dict[str, Any]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Differential]:
    """One edge and one node for the module (no test disturbs them); both logging at debug
    level. Afterwards, once both have stopped, their whole logs must not hold the token."""
    directory: Path = tmp_path_factory.mktemp("differential")
    token_file = write_token(directory, FAR_TOKEN)
    async with FakeOpenAI() as oa, FakeOllama() as ol:
        doc = differential_doc(oa.base_url, ol.base_url)
        config = directory / "edge.yaml"
        config.write_text(dump(doc))
        async with (
            serving_edge(config) as edge,
            LinkTap(edge.host_port("nodes")) as tap,
            joined_node(edge, "far", token_file, "--log-level", "debug", url=tap.url) as node,
        ):
            yield Differential(edge, node, tap, doc)
    assert FAR_TOKEN not in node.output
    assert FAR_TOKEN not in "".join(edge.lines)


@pytest_asyncio.fixture(loop_scope="module")
async def oa_client(world: Differential) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=world.edge.addresses["openai"] + "/v1", api_key=APP_TOKEN, max_retries=0
    ) as client:
        yield client


@pytest_asyncio.fixture(loop_scope="module")
async def an_client(world: Differential) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(
        base_url=world.edge.addresses["openai"], api_key=APP_TOKEN, max_retries=0
    ) as client:
        yield client


Ask = Callable[[str], Awaitable[Any]]
"""One request to a model, its answer (or its stream's events) as JSON-like data."""


def surfaces(oa: openai.AsyncOpenAI, an: anthropic.AsyncAnthropic, prompt: str) -> dict[str, Ask]:
    """Each API surface asking ``prompt``, plain and streamed."""

    async def chat(model: str) -> Any:
        answer = await oa.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}]
        )
        return answer.model_dump()

    async def chat_stream(model: str) -> Any:
        stream = await oa.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            stream=True,
            stream_options={"include_usage": True},
        )
        return [chunk.model_dump() async for chunk in stream]

    async def messages(model: str) -> Any:
        answer = await an.messages.create(
            model=model, max_tokens=64, messages=[{"role": "user", "content": prompt}]
        )
        return answer.model_dump()

    async def messages_stream(model: str) -> Any:
        stream = await an.messages.create(
            model=model,
            max_tokens=64,
            messages=[{"role": "user", "content": prompt}],
            stream=True,
        )
        return [event.model_dump() async for event in stream]

    async def responses(model: str) -> Any:
        answer = await oa.responses.create(model=model, input=prompt)
        return answer.model_dump()

    async def responses_stream(model: str) -> Any:
        stream = await oa.responses.create(model=model, input=prompt, stream=True)
        return [event.model_dump() async for event in stream]

    return {
        "chat": chat,
        "chat-stream": chat_stream,
        "messages": messages,
        "messages-stream": messages_stream,
        "responses": responses,
        "responses-stream": responses_stream,
    }


async def both(ask: Ask, kind: str) -> tuple[Any, Any]:
    """``ask``'s answer from the local provider of ``kind`` and from the remote one, each
    normalized (:func:`~tests.helpers.remote_e2e.normalized`)."""
    here = await ask(f"{kind}-here")
    far = await ask(f"{kind}-far")
    return normalized(here, f"{kind}-here"), normalized(far, f"{kind}-far")


def usage_of(answer: Any) -> Any:
    """The usage an answer (or the last event of a stream that carries one) reports."""
    if isinstance(answer, list):
        found = [usage_of(event) for event in answer]
        return next(u for u in reversed(found) if u)
    if not isinstance(answer, dict):
        return None
    for key in ("usage", "message", "response"):
        value = answer.get(key)
        if isinstance(value, dict) and key == "usage":
            return value
        if isinstance(value, dict) and value.get("usage"):
            return value["usage"]
    return None


@pytest.mark.parametrize("surface", SURFACES)
@pytest.mark.parametrize("kind", KINDS)
async def test_a_remote_provider_answers_like_the_same_provider_local(
    world: Differential,
    oa_client: openai.AsyncOpenAI,
    an_client: anthropic.AsyncAnthropic,
    kind: str,
    surface: str,
) -> None:
    """Issue 29 items 1 and 11: the same request on ``{kind}-here`` (in the edge's process)
    and on ``{kind}-far`` (over the link, in ``iop-node``) gets the same answer — the whole
    body, or every event of the stream, equal but for ids and times — with the same usage;
    the answer is the upstream's echo of the prompt (not two equal errors)."""
    here, far = await both(surfaces(oa_client, an_client, PROMPT)[surface], kind)
    assert far == here
    assert PROMPT.split()[-1] in str(here)
    usage = usage_of(here)
    assert usage
    assert usage == usage_of(far)


TOOL: Final[ChatCompletionFunctionToolParam] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
#: The fake OpenAI-compatible upstream calls the tool this directive names; the fake Ollama
#: calls the first tool it is given with the prompt as its first required parameter.
TOOL_PROMPT: Final = '[[fake:tool_call=get_weather:{"city": "Paris"}]] What is the weather?'


def chat_tool_call(events: list[dict[str, Any]]) -> tuple[str, str]:
    """The name and the arguments (its fragments joined) of a chat stream's tool call."""
    calls = [
        call
        for event in events
        for choice in event["choices"]
        for call in choice["delta"]["tool_calls"] or ()
    ]
    name = next(c["function"]["name"] for c in calls if c["function"]["name"])
    return name, "".join(c["function"]["arguments"] or "" for c in calls)


def messages_tool_use(events: list[dict[str, Any]]) -> tuple[str, str]:
    """The name and the input (its JSON fragments joined) of a Messages stream's tool use."""
    [start] = [
        e
        for e in events
        if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use"
    ]
    fragments = [
        e["delta"]["partial_json"]
        for e in events
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta"
    ]
    return start["content_block"]["name"], "".join(fragments)


@pytest.mark.parametrize(
    ("kind", "surface", "expected"),
    [
        ("oa", "chat", {"city": "Paris"}),
        ("ol", "chat", {"city": "What is the weather?"}),
        ("oa", "messages", {"city": "Paris"}),
    ],
)
async def test_a_tool_call_stream_is_the_same_remote(
    world: Differential,
    oa_client: openai.AsyncOpenAI,
    an_client: anthropic.AsyncAnthropic,
    kind: str,
    surface: str,
    expected: dict[str, str],
) -> None:
    """Issue 29 items 1 and 11: a streamed tool call (its head, then its arguments in
    fragments) comes event for event the same through the remote node — on chat from the
    OpenAI-compatible and the Ollama upstream, and on Messages as a ``tool_use`` block."""

    async def chat(model: str) -> Any:
        stream = await oa_client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": TOOL_PROMPT}],
            tools=[TOOL],
            stream=True,
            stream_options={"include_usage": True},
        )
        return [chunk.model_dump() async for chunk in stream]

    async def messages(model: str) -> Any:
        function: Any = TOOL["function"]
        stream = await an_client.messages.create(
            model=model,
            max_tokens=64,
            messages=[{"role": "user", "content": TOOL_PROMPT}],
            tools=[{"name": function["name"], "input_schema": function["parameters"]}],
            stream=True,
        )
        return [event.model_dump() async for event in stream]

    ask, tool_call = (chat, chat_tool_call) if surface == "chat" else (messages, messages_tool_use)
    here, far = await both(ask, kind)
    assert far == here
    name, arguments = tool_call(here)
    assert (name, json.loads(arguments)) == ("get_weather", expected)


def agents_under(pid: int) -> dict[int, str]:
    """The fake CLI agents running as children of process ``pid``."""
    return {p: cmd for p, cmd in children_of(pid).items() if "iop_edge.testing.fake_cli" in cmd}


@pytest.mark.parametrize("where", ["here", "far"])
async def test_the_cli_agent_runs_on_its_node_never_on_the_edge(
    world: Differential, oa_client: openai.AsyncOpenAI, where: str
) -> None:
    """Issue 29 items 1 and 11: a remote ``cli`` provider's agent is a child of ``iop-node``,
    and the edge starts none; the local one's is the edge's own child (so the check can tell).
    The client leaving ends the agent wherever it runs, and the edge holds nothing after."""
    edge_pid, node_pid = world.edge.process.pid, world.node.process.pid
    runs_under, never_under = (edge_pid, node_pid) if where == "here" else (node_pid, edge_pid)
    asked = asyncio.create_task(
        oa_client.chat.completions.create(
            model=f"cli-{where}",
            messages=[{"role": "user", "content": "[[fake-cli: --hang]] wait for me"}],
            stream=True,
        )
    )
    try:
        await wait_for(lambda: bool(agents_under(runs_under)))
        assert agents_under(never_under) == {}
    finally:
        asked.cancel()
        await asyncio.gather(asked, return_exceptions=True)
    await wait_for(lambda: not agents_under(runs_under))
    await edge_at_rest(world.edge)


#: Families that differ between a local and a remote request by nature: the link's own
#: figures, the probes (they run on their own time) and the durations' distributions.
NOT_COMPARED: Final = re.compile(
    r"^iop_edge_(node_|health_probes)|_seconds_(bucket|sum)\{|_created\{"
)


def deltas(
    before: dict[str, float], after: dict[str, float], names: tuple[str, ...]
) -> dict[str, float]:
    """What changed between two scrapes in the series whose labels name ``names`` (a model,
    node or provider id), with those names made ``<x>``."""
    changed: dict[str, float] = {}
    for key, value in after.items():
        delta = value - before.get(key, 0.0)
        if not delta or NOT_COMPARED.search(key):
            continue
        if any(f'"{name}"' in key for name in names):
            for name in names:
                key = key.replace(f'"{name}"', '"<x>"')
            changed[key] = delta
    return changed


async def test_a_remote_request_is_counted_like_a_local_one(
    world: Differential, oa_client: openai.AsyncOpenAI, an_client: anthropic.AsyncAnthropic
) -> None:
    """Issue 29 items 5 and 11: admission and accounting stay the edge's — a request served
    remote moves the same metrics by the same amounts (requests, attempts, tokens, durations'
    counts, time to first token) and writes the same request line as the same request
    served local, but for its model, node and provider."""
    edge = world.edge
    asks = surfaces(oa_client, an_client, "count me")
    before = await edge_metrics(edge)
    lines = len(log_events(edge, "request"))
    for model in ("oa-here", "oa-far"):
        for surface in ("chat", "chat-stream", "messages-stream"):
            await asks[surface](model)
    await wait_for_log(edge, "request", after=lines + 5)
    after = await edge_metrics(edge)
    here = deltas(before, after, ("oa-here", "here"))
    far = deltas(before, after, ("oa-far", "far"))
    assert here == far
    assert here['iop_edge_requests_total{code="ok",model="<x>",token_ref="diff-app"}'] == 3
    assert here['iop_edge_provider_requests_total{code="ok",node="<x>",provider="<x>"}'] == 3
    written = log_events(edge, "request")[lines:]
    varying = ("request_id", "timestamp", "duration_ms", "queue_wait_ms", "model", "node")
    local = without([w for w in written if w["node"] == "here"], *varying, "provider")
    remote = without([w for w in written if w["node"] == "far"], *varying, "provider")
    assert local == remote
    assert [w["provider"] for w in written] == ["oa-here"] * 3 + ["oa-far"] * 3


async def test_the_node_receives_its_own_payload_and_nothing_else(
    world: Differential, oa_client: openai.AsyncOpenAI
) -> None:
    """Issue 29 item 9: what the node received on its link (every byte, through the tap) holds
    its own node's payload — exactly what ``iop-edge config payload --node far`` gives, at
    the generation the edge reports acknowledged — and nothing of the rest of the config:
    no principal (token hash, token or principal names), no queue policy, no other node
    (local ``here`` or remote ``spare``: ids, URLs, credentials), no token hash at all, and
    never the node's own token."""
    await oa_client.chat.completions.create(
        model="oa-far", messages=[{"role": "user", "content": "one more over the tap"}]
    )
    expected = node_payload(load_config(dump(world.doc)), "far")
    frames = link_frames(world.tap.to_node)
    [payload] = [f for f in frames if f.kind is Kind.PAYLOAD]
    assert payload.meta == {
        "generation": payload_generation(expected),
        "payload": expected.model_dump(mode="json"),
    }
    status = await wait_status(world.edge, lambda s: node_status(s, "far")["connected"])
    assert node_status(status, "far")["generation_acked"] == payload_generation(expected)
    assert any(f.kind is Kind.REQ for f in frames)  # (the capture holds the requests too)
    received = bytes(world.tap.to_node)
    forbidden = [
        token_hash(APP_TOKEN),
        APP_TOKEN,
        "diff-app",
        "diff-team",
        "principal",
        "max_queue",
        "queue_timeout",
        "token_hash",
        token_hash(FAR_TOKEN),
        token_hash(SPARE_TOKEN),
        '"here"',
        "oa-here",
        "cli-here",
        "spare",
        "vault",
        "10.77.0.2",
        SPARE_SECRET,
        FAR_TOKEN,
    ]
    assert [text for text in forbidden if text.encode() in received] == []
    assert FAR_TOKEN.encode() in bytes(world.tap.to_edge)  # (the node's dial went through it)


async def test_neither_process_logs_the_node_token(
    world: Differential, oa_client: openai.AsyncOpenAI
) -> None:
    """Issue 29 item 9: the node's token (which the node sends on every dial) appears in no
    line of the edge's log nor of the node's, both at debug level, after the node connected
    and served requests."""
    await oa_client.chat.completions.create(
        model="cli-far", messages=[{"role": "user", "content": "log this request"}]
    )
    assert log_events(world.edge, "node_link_up")
    assert world.node.events("node_connected")
    assert FAR_TOKEN not in "".join(world.edge.lines)
    assert FAR_TOKEN not in world.node.output
