"""Issue 27, ``count_tokens``: an ``openai_compat`` upstream's own tokenizer (vLLM's
``/tokenize``, else llama.cpp's ``/apply-template`` + ``/tokenize``), detected once per
executor; ``None`` whenever it cannot count — against the fake's tokenizer dialects on
127.0.0.1."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from iop_edge.adapters import AdapterSet, Executor
from iop_edge.adapters.tokenize import TOKENIZE_TIMEOUT_MS, server_root
from iop_edge.runtime.logs import configure_logging
from iop_edge.testing.clock import FakeClock
from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_ollama import FakeOllama
from iop_edge.testing.fake_openai import FakeOpenAI
from iop_edge.testing.fake_tokenizer import FakeTokenizer, fake_chat_tokens
from iop_edge.translate.count_tokens import estimate_chat_tokens
from tests.helpers import FAKE_CLI, LogCapture, pass_deadline
from tests.helpers.adapters import dead_port

SetFactory = Callable[..., AdapterSet]

SECRET = "sk-provider-secret"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the workspace",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


def chat_body(text: str = "hello upstream world", **fields: Any) -> dict[str, Any]:
    """A chat body as the Messages surface builds it: a system prompt and one user turn."""
    return {
        "model": "group",
        "messages": [
            {"role": "system", "content": "You are a careful assistant."},
            {"role": "user", "content": [{"type": "text", "text": text}]},
        ],
        **fields,
    }


async def count(executor: Executor, body: dict[str, Any] | None = None) -> int | None:
    return await executor.count_tokens(
        body or chat_body(), "fake-model", {"Authorization": f"Bearer {SECRET}"}, "req-7"
    )


def provider(
    sets: SetFactory, base_url: str, clock: FakeClock | None = None, **fields: Any
) -> Executor:
    return sets(
        [{"name": "api", "type": "openai_compat", "base_url": base_url}],
        [{"id": "p1", "type": "openai_compat", "adapter": "api", **fields}],
        clock,
    ).for_provider("p1")


def paths(fake: FakeOpenAI) -> list[str]:
    """The paths of the requests the fake received, in order."""
    return [r.path for r in fake.requests]


@pytest.fixture
async def upstream(request: pytest.FixtureRequest) -> AsyncIterator[FakeOpenAI]:
    """A fake speaking the dialect the test is parametrized with (default vLLM's)."""
    dialect: FakeTokenizer | None = getattr(request, "param", "vllm")
    async with FakeOpenAI(tokenizer=dialect) as fake:
        yield fake


def test_the_fake_count_differs_from_the_edge_estimate() -> None:
    """What lets the other tests tell an upstream count from the estimate."""
    body = chat_body(tools=TOOLS)
    assert fake_chat_tokens(body["messages"], TOOLS) != estimate_chat_tokens(body)
    assert fake_chat_tokens(chat_body()["messages"]) != estimate_chat_tokens(chat_body())


def test_the_root_paths_are_beside_v1() -> None:
    assert server_root("http://gpu-1:8000/v1") == "http://gpu-1:8000"
    assert server_root("http://gpu-1:8000/v1/") == "http://gpu-1:8000"
    assert server_root("http://gpu-1:8080") == "http://gpu-1:8080"
    assert server_root("http://proxy/vllm/v1") == "http://proxy/vllm"
    assert server_root(None) is None


async def test_vllm_counts_with_the_chat_template(sets: SetFactory, upstream: FakeOpenAI) -> None:
    """One POST /tokenize at the root (base_url's /v1 stripped) with the messages, the tools
    and add_generation_prompt, carrying the provider's headers and the request id."""
    executor = provider(sets, upstream.base_url)
    body = chat_body(tools=TOOLS)
    assert await count(executor, body) == fake_chat_tokens(body["messages"], TOOLS)
    assert paths(upstream) == ["/tokenize"]
    sent = upstream.requests[0]
    assert sent.json == {
        "model": "fake-model",
        "messages": body["messages"],
        "tools": TOOLS,
        "add_generation_prompt": True,
    }
    assert sent.headers["Authorization"] == f"Bearer {SECRET}"
    assert sent.headers["x-request-id"] == "req-7"


@pytest.mark.parametrize("upstream", ["llama_cpp"], indirect=True)
async def test_llama_cpp_applies_the_template_then_tokenizes(
    sets: SetFactory, upstream: FakeOpenAI
) -> None:
    """vLLM's shape first (llama-server answers it {"tokens": []}: not its dialect), then
    /apply-template and /tokenize with the templated prompt, BOS and specials as for a chat."""
    executor = provider(sets, upstream.base_url)
    body = chat_body(tools=TOOLS)
    assert await count(executor, body) == fake_chat_tokens(body["messages"], TOOLS)
    assert paths(upstream) == ["/tokenize", "/apply-template", "/tokenize"]
    templated = upstream.requests[1].json
    assert templated == {"model": "fake-model", "messages": body["messages"], "tools": TOOLS}
    tokenized = upstream.requests[2].json
    assert tokenized["add_special"] is True
    assert tokenized["parse_special"] is True
    assert tokenized["content"].endswith("<|assistant|>")
    assert all(r.headers["Authorization"] == f"Bearer {SECRET}" for r in upstream.requests)


@pytest.mark.parametrize(
    ("upstream", "per_call"),
    [("vllm", ["/tokenize"]), ("llama_cpp", ["/apply-template", "/tokenize"])],
    indirect=["upstream"],
)
async def test_the_dialect_that_worked_is_used_alone_after(
    sets: SetFactory, upstream: FakeOpenAI, per_call: list[str]
) -> None:
    executor = provider(sets, upstream.base_url)
    assert await count(executor) == fake_chat_tokens(chat_body()["messages"])
    upstream.clear()
    for text in ("one two", "one two three four"):
        body = chat_body(text)
        assert await count(executor, body) == fake_chat_tokens(body["messages"])
    assert paths(upstream) == per_call * 2


@pytest.mark.parametrize("upstream", [None], indirect=True)
async def test_neither_dialect_is_none_and_remembered(
    sets: SetFactory, upstream: FakeOpenAI
) -> None:
    """404 on both: None, and later calls send nothing at all."""
    executor = provider(sets, upstream.base_url)
    assert await count(executor) is None
    assert paths(upstream) == ["/tokenize", "/apply-template"]
    for _ in range(3):
        assert await count(executor) is None
    assert upstream.total_requests == 2


async def test_a_5xx_is_not_remembered(sets: SetFactory, upstream: FakeOpenAI) -> None:
    """A server error stops the call (None, no other dialect tried); the next call detects
    again and counts."""
    executor = provider(sets, upstream.base_url)
    upstream.enqueue(FakeBehavior(status=503))
    assert await count(executor) is None
    assert paths(upstream) == ["/tokenize"]
    assert await count(executor) == fake_chat_tokens(chat_body()["messages"])
    assert paths(upstream) == ["/tokenize", "/tokenize"]


async def test_a_400_tries_the_next_dialect_and_is_not_remembered(
    sets: SetFactory, upstream: FakeOpenAI
) -> None:
    """A 400 may be this request's fault (a template that cannot render it): llama.cpp's
    dialect is tried (404 here: remembered), and vLLM's is tried again on the next call."""
    executor = provider(sets, upstream.base_url)
    upstream.enqueue(FakeBehavior(status=400))
    assert await count(executor) is None
    assert paths(upstream) == ["/tokenize", "/apply-template"]
    assert await count(executor) == fake_chat_tokens(chat_body()["messages"])
    assert await count(executor) is not None
    assert paths(upstream) == ["/tokenize", "/apply-template", "/tokenize", "/tokenize"]


async def test_a_replaced_upstream_is_detected_again(
    sets: SetFactory, upstream: FakeOpenAI
) -> None:
    """The remembered dialect answering in another shape is forgotten (None once); the next
    call finds the new one."""
    executor = provider(sets, upstream.base_url)
    assert await count(executor) is not None
    upstream.tokenizer = "llama_cpp"
    upstream.clear()
    assert await count(executor) is None
    assert await count(executor) == fake_chat_tokens(chat_body()["messages"])
    assert paths(upstream) == ["/tokenize", "/apply-template", "/tokenize"]


@pytest.mark.parametrize(("timeout_ms", "due"), [(None, TOKENIZE_TIMEOUT_MS / 1000), (300, 0.3)])
async def test_a_timeout_is_none_and_not_remembered(
    sets: SetFactory, upstream: FakeOpenAI, timeout_ms: int | None, due: float
) -> None:
    """Bounded by the provider's request_timeout_ms, at most TOKENIZE_TIMEOUT_MS (the
    default 10 minutes would hold a client's count for as long)."""
    clock = FakeClock()
    fields = {} if timeout_ms is None else {"request_timeout_ms": timeout_ms}
    executor = provider(sets, upstream.base_url, clock, **fields)
    upstream.behavior = FakeBehavior(hold=True)
    counting = asyncio.create_task(count(executor))
    await pass_deadline(clock, due, lambda: upstream.in_flight == 1)
    assert await counting is None
    upstream.behavior = FakeBehavior()
    upstream.release()
    assert await count(executor) == fake_chat_tokens(chat_body()["messages"])
    assert paths(upstream) == ["/tokenize", "/tokenize"]


async def test_a_connection_failure_is_none(sets: SetFactory) -> None:
    executor = provider(sets, f"http://127.0.0.1:{dead_port()}/v1")
    assert await count(executor) is None


async def test_a_failure_is_logged_at_debug_with_the_provider_and_never_the_token(
    sets: SetFactory, upstream: FakeOpenAI
) -> None:
    log = LogCapture()
    configure_logging("debug", "json", log)
    executor = provider(sets, upstream.base_url)
    upstream.enqueue(FakeBehavior(status=500, error_message="tokenizer exploded"))
    assert await count(executor) is None
    lines = [json.loads(line) for line in log.getvalue().splitlines()]
    [line] = [e for e in lines if e["event"] == "upstream_token_count_unavailable"]
    assert line["level"] == "debug"
    assert line["provider"] == "openai_compat provider 'p1' (adapter 'api')"
    assert "500" in line["reason"]
    assert "tokenizer exploded" in line["reason"]
    assert SECRET not in log.getvalue()


async def test_ollama_and_cli_cannot_count(sets: SetFactory, fake_ol: FakeOllama) -> None:
    """Ollama has no tokenizer endpoint and a CLI no tokenizer: None, nothing sent."""
    adapters = sets(
        [
            {"name": "local", "type": "ollama", "base_url": fake_ol.base_url},
            {"name": "shell", "type": "cli", "command": FAKE_CLI[0], "args": FAKE_CLI[1:]},
        ],
        [
            {"id": "o1", "type": "ollama", "adapter": "local"},
            {"id": "c1", "type": "cli", "adapter": "shell"},
        ],
    )
    for name in ("o1", "c1"):
        assert await count(adapters.for_provider(name)) is None
    assert fake_ol.total_requests == 0
