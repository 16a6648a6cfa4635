"""Issue 15, the OpenAI surface: embeddings, unknown paths, Ollama tools, fields a provider
cannot honour, the answer's model, x-request-id, cli usage estimates and /v1/models — end to
end through the ``openai`` SDK against a real edge on 127.0.0.1 and the fake upstreams."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from iop_edge.config import parse_config
from iop_edge.daemon import Daemon
from iop_edge.testing.fake_ollama import FakeOllama
from iop_edge.testing.fake_openai import FakeOpenAI
from iop_edge.testing.fake_upstream import fake_embedding
from tests.helpers.api import TOKEN, edge_doc, running_edge

HELLO: Any = [{"role": "user", "content": "hello through the edge"}]
WEATHER: Any = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def user(text: str) -> Any:
    """A conversation of one user message."""
    return [{"role": "user", "content": text}]


def surface_doc(oa: FakeOpenAI, ol: FakeOllama) -> dict[str, Any]:
    """:func:`edge_doc` with its metrics on a free port, plus ``mixed`` (openai_compat, ollama
    and cli providers in one group) and ``local`` (ollama and cli)."""
    doc = edge_doc(oa, ol)
    doc["metrics"] = {"listen": "127.0.0.1:0"}
    doc["console"] = {"listen": "127.0.0.1:0"}
    doc["models"] += [
        {"id": "mixed", "context_window_tokens": 4096, "providers": ["up", "lo", "cat"]},
        {"id": "local", "context_window_tokens": 4096, "providers": ["lo", "cat"]},
    ]
    return doc


@contextlib.asynccontextmanager
async def surface(
    oa: FakeOpenAI, ol: FakeOllama, doc: dict[str, Any] | None = None
) -> AsyncIterator[tuple[Daemon, openai.AsyncOpenAI]]:
    async with (
        running_edge(doc or surface_doc(oa, ol)) as daemon,
        openai.AsyncOpenAI(base_url=daemon.openai_url, api_key=TOKEN, max_retries=0) as client,
    ):
        yield daemon, client


async def scrape(daemon: Daemon) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with aiohttp.ClientSession() as session, session.get(daemon.metrics_url) as r:
        text = await r.text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def request_lines(log_stream: io.StringIO) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    return [line for line in lines if line.get("event") == "request"]


def tokens(metrics: dict[Any, float], name: str, model: str, direction: str) -> float:
    key = (name, (("direction", direction), ("model", model), ("token_ref", "app-chat")))
    return metrics.get(key, 0.0)


# -- POST /v1/embeddings ---------------------------------------------------------------------


@pytest.mark.parametrize("model", ["chat-oa", "chat-ol"])
@pytest.mark.parametrize("encoding", ["base64", "float"])
async def test_embeddings_through_the_sdk_on_openai_compat_and_ollama(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama, log_stream: io.StringIO, model: str, encoding: str
) -> None:
    """Embeddings are admitted like chat and answered in OpenAI's format whichever provider
    serves them: passthrough to {base_url}/embeddings, Ollama's /api/embed translated — the
    SDK's default base64 encoding included. Usage is counted in the metrics."""
    async with surface(fake_oa, fake_ol) as (daemon, client):
        texts = ["the first text", "a second one"]
        if encoding == "base64":  # the SDK asks for base64 and decodes it itself
            reply = await client.embeddings.create(model=model, input=texts)
        else:
            reply = await client.embeddings.create(
                model=model, input=texts, encoding_format="float"
            )
        metrics = await scrape(daemon)
    assert reply.model == model
    assert [e.index for e in reply.data] == [0, 1]
    assert [e.embedding for e in reply.data] == [fake_embedding(t) for t in texts]
    assert (reply.usage.prompt_tokens, reply.usage.total_tokens) == (6, 6)
    upstream = (fake_oa if model == "chat-oa" else fake_ol).requests[-1]
    assert upstream.path == ("/v1/embeddings" if model == "chat-oa" else "/api/embed")
    assert upstream.json["model"] == ("fake-model")
    assert upstream.json["input"] == texts
    (line,) = request_lines(log_stream)
    assert (line["endpoint"], line["model"], line["status"], line["prompt_tokens"]) == (
        "embeddings",
        model,
        200,
        6,
    )
    assert line["stream"] is False
    requests = (
        "iop_edge_requests_total",
        (("code", "ok"), ("model", model), ("token_ref", "app-chat")),
    )
    assert metrics[requests] == 1
    assert tokens(metrics, "iop_edge_tokens_total", model, "prompt") == 6


async def test_embeddings_with_dimensions_and_a_single_string(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    async with surface(fake_oa, fake_ol) as (_, client):
        reply = await client.embeddings.create(model="chat-ol", input="one", dimensions=3)
    assert [e.embedding for e in reply.data] == [fake_embedding("one", 3)]
    assert fake_ol.requests[-1].json == {"model": "fake-model", "input": "one", "dimensions": 3}


async def test_embeddings_skip_the_cli_providers_of_a_group(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    """A provider that cannot embed is no candidate: 'local' (ollama + cli) always embeds on
    its ollama provider, and the group declares nothing for it."""
    async with surface(fake_oa, fake_ol) as (_, client):
        for n in range(4):
            reply = await client.embeddings.create(model="local", input=f"text {n}")
            assert reply.data[0].embedding == fake_embedding(f"text {n}")
    assert fake_ol.statistics().total_requests == 4


async def test_embeddings_on_a_model_without_an_embedding_provider_is_a_clear_400(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    async with surface(fake_oa, fake_ol) as (_, client):
        with pytest.raises(openai.BadRequestError) as caught:
            await client.embeddings.create(model="chat-cli", input="x")
    error = caught.value
    assert (error.status_code, error.code, error.param) == (400, "unsupported_endpoint", "model")
    assert "The model 'chat-cli' does not serve /v1/embeddings" in error.message
    assert "cli, which cannot embed" in error.message


@pytest.mark.parametrize(
    ("given", "param"),
    [({}, "input"), ({"input": ""}, "input"), ({"input": ["a", 3]}, "input")],
)
async def test_a_bad_embeddings_input_is_a_400_naming_it(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama, given: dict[str, Any], param: str
) -> None:
    async with (
        surface(fake_oa, fake_ol) as (daemon, _),
        aiohttp.ClientSession() as session,
        session.post(
            daemon.openai_url + "/embeddings",
            json={"model": "chat-oa", **given},
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as response,
    ):
        body = await response.json()
    assert response.status == 400
    assert body["error"]["param"] == param


async def test_token_id_input_goes_to_the_providers_that_take_it(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    """Ollama embeds text only: in 'mixed' a token-id input goes to the openai_compat
    provider; in 'chat-ol' it is a 400 naming input."""
    async with surface(fake_oa, fake_ol) as (_, client):
        for _ in range(3):
            reply = await client.embeddings.create(model="mixed", input=[[1, 2, 3]])
            assert reply.data[0].embedding == fake_embedding("1 2 3")
        with pytest.raises(openai.BadRequestError) as caught:
            await client.embeddings.create(model="chat-ol", input=[1, 2])
    assert fake_ol.statistics().total_requests == 0
    assert (caught.value.code, caught.value.param) == ("unsupported_parameter", "input")


# -- unknown paths and methods -----------------------------------------------------------------


async def test_unknown_paths_and_methods_answer_the_openai_envelope_logged_and_counted(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama, log_stream: io.StringIO
) -> None:
    async with surface(fake_oa, fake_ol) as (daemon, _), aiohttp.ClientSession() as session:
        base = daemon.openai_url.removesuffix("/v1")
        auth = {"Authorization": f"Bearer {TOKEN}", "x-request-id": "probe-1"}
        async with session.get(base + "/v1/nope/secret-path-123", headers=auth) as r404:
            body404 = await r404.json()
            headers404 = r404.headers
        async with session.post(base + "/v1/models", headers=auth) as r405:
            body405 = await r405.json()
            headers405 = r405.headers
        async with session.delete(base + "/v1/chat/completions") as r405b:
            allow_chat = r405b.headers["Allow"]
        metrics = await scrape(daemon)
    assert r404.status == 404
    assert body404["error"]["code"] == "unknown_url"
    assert body404["error"]["type"] == "invalid_request_error"
    assert "GET /v1/nope/secret-path-123" in body404["error"]["message"]
    assert headers404["x-request-id"] == "probe-1"
    assert headers404["Content-Type"].startswith("application/json")
    assert r405.status == 405
    assert body405["error"]["code"] == "method_not_allowed"
    assert headers405["Allow"] == "GET, HEAD"
    assert allow_chat == "POST"
    lines = request_lines(log_stream)
    assert [(x["method"], x["path"], x["status"], x["code"]) for x in lines] == [
        ("GET", "/v1/nope/secret-path-123", 404, "unknown_url"),
        ("POST", "/v1/models", 405, "method_not_allowed"),
        ("DELETE", "/v1/chat/completions", 405, "method_not_allowed"),
    ]
    assert lines[0]["request_id"] == "probe-1"
    assert lines[0]["token_ref"] == "app-chat"
    counted = {
        labels: value
        for (name, labels), value in metrics.items()
        if name == "iop_edge_requests_total"
    }
    assert counted == {
        (("code", "unknown_url"), ("model", "(unknown)"), ("token_ref", "app-chat")): 1,
        (("code", "method_not_allowed"), ("model", "(unknown)"), ("token_ref", "app-chat")): 1,
        (("code", "method_not_allowed"), ("model", "(unknown)"), ("token_ref", "(none)")): 1,
    }
    # The path is never a label value.
    assert not any("secret-path" in str(key) for key in metrics)


# -- Ollama tools ----------------------------------------------------------------------------


async def test_ollama_tool_calls_both_ways_through_the_sdk(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    async with surface(fake_oa, fake_ol) as (_, client):
        first = await client.chat.completions.create(
            model="chat-ol",
            messages=user("Paris"),
            tools=WEATHER,
        )
        sent = fake_ol.requests[-1].json
        choice = first.choices[0]
        (call,) = choice.message.tool_calls or []
        history: Any = [
            {"role": "user", "content": "Paris"},
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
        ]
        second = await client.chat.completions.create(
            model="chat-ol",
            messages=history,
            tools=WEATHER,
        )
        followed = fake_ol.requests[-1].json
    assert sent["tools"] == WEATHER
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert call.type == "function"
    assert call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    # The history went to Ollama in its form: arguments an object, the tool's name.
    assert followed["messages"][1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
    }
    assert followed["messages"][2] == {
        "role": "tool",
        "content": "sunny, 21 C",
        "tool_name": "get_weather",
    }
    assert second.choices[0].message.content == "the tool said: sunny, 21 C"
    assert second.choices[0].finish_reason == "stop"


async def test_ollama_streamed_tool_calls_are_openai_deltas(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    async with surface(fake_oa, fake_ol) as (_, client):
        stream = await client.chat.completions.create(
            model="chat-ol",
            messages=user("Seoul"),
            tools=WEATHER,
            stream=True,
        )
        chunks = [chunk async for chunk in stream]
    deltas = [
        c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls
    ]
    assert len(deltas) == 1
    (call,) = deltas[0]
    assert (call.index, call.type) == (0, "function")
    assert call.id
    assert call.id.startswith("call_")
    assert call.function is not None
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments or "") == {"city": "Seoul"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert {c.model for c in chunks} == {"chat-ol"}


async def test_tool_choice_none_sends_no_tools_to_ollama(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    async with surface(fake_oa, fake_ol) as (_, client):
        reply = await client.chat.completions.create(
            model="chat-ol",
            messages=user("just talk"),
            tools=WEATHER,
            tool_choice="none",
        )
    assert "tools" not in fake_ol.requests[-1].json
    assert reply.choices[0].message.content == "just talk"


# -- fields a provider cannot honour ----------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "fields", "param", "says"),
    [
        ("chat-ol", {"n": 2}, "n", "its ollama providers: 'n': it returns one choice"),
        ("chat-ol", {"logprobs": True}, "logprobs", "log probabilities"),
        ("chat-ol", {"tool_choice": "required", "tools": WEATHER}, "tool_choice", "forced"),
        ("chat-ol", {"extra_body": {"top_k": 5}}, "top_k", "does not translate this field"),
        ("chat-cli", {"temperature": 0.5}, "temperature", "its cli providers"),
        ("chat-cli", {"tools": WEATHER}, "tools", "cannot call tools"),
        ("local", {"n": 3}, "n", "its ollama providers: 'n'"),
    ],
)
async def test_a_field_no_provider_of_the_model_honours_is_a_400_naming_it(
    fake_oa: FakeOpenAI,
    fake_ol: FakeOllama,
    model: str,
    fields: dict[str, Any],
    param: str,
    says: str,
) -> None:
    async with surface(fake_oa, fake_ol) as (daemon, client):
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model=model, messages=HELLO, **fields)
        stats = daemon.scheduler.statistics()
    error = caught.value
    assert (error.status_code, error.code, error.param) == (400, "unsupported_parameter", param)
    assert f"No provider of the model '{model}' can honour this request" in error.message
    assert says in error.message
    assert fake_ol.statistics().total_requests == 0  # refused before admission: no slot taken
    assert all(p.in_flight == 0 for p in stats.providers)


async def test_fields_only_some_providers_honour_go_to_those_providers(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    """In 'mixed' (openai_compat, ollama, cli): n=2 always lands on openai_compat, tools on
    openai_compat or ollama, never on cli; a plain request may use any of them."""
    async with surface(fake_oa, fake_ol) as (_, client):
        for _ in range(4):
            reply = await client.chat.completions.create(model="mixed", messages=HELLO, n=2)
            assert reply.model == "mixed"
        assert fake_oa.statistics().total_requests == 4
        assert fake_ol.statistics().total_requests == 0
        for _ in range(4):
            reply = await client.chat.completions.create(
                model="mixed",
                messages=user("Oslo"),
                tools=WEATHER,
            )
            assert reply.model == "mixed"
    # The four tool requests were shared between the two providers that take tools (the fake
    # OpenAI answers in text, the fake Ollama with a call); none went to cat.
    assert fake_oa.statistics().total_requests + fake_ol.statistics().total_requests == 8


async def test_accepted_defaults_and_fields_without_effect_pass_on_ollama(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    async with surface(fake_oa, fake_ol) as (_, client):
        reply = await client.chat.completions.create(
            model="chat-ol",
            messages=HELLO,
            n=1,
            logprobs=False,
            user="end-user-7",
            metadata={"app": "x"},
            parallel_tool_calls=True,
            tools=WEATHER,
            tool_choice="auto",
        )
    assert reply.choices[0].finish_reason == "tool_calls"
    assert set(fake_ol.requests[-1].json) == {"model", "messages", "stream", "options", "tools"}


# -- the answer's model ------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["chat-oa", "chat-ol", "chat-cli", "legacy"])
async def test_the_answer_names_the_model_the_client_asked_for(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama, model: str
) -> None:
    """Not the provider's target (``fake-model``, ``agent``): streaming (every chunk) or not."""
    async with surface(fake_oa, fake_ol) as (_, client):
        reply = await client.chat.completions.create(model=model, messages=HELLO)
        stream = await client.chat.completions.create(
            model=model, messages=HELLO, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in stream]
    assert reply.model == model
    assert len(chunks) > 2
    assert {chunk.model for chunk in chunks} == {model}


async def test_completions_name_the_model_the_client_asked_for(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    async with surface(fake_oa, fake_ol) as (_, client):
        reply = await client.completions.create(model="chat-oa", prompt="say it")
        stream = await client.completions.create(model="chat-oa", prompt="say it", stream=True)
        chunks = [chunk async for chunk in stream]
    assert fake_oa.requests[-1].json["model"] == "fake-model"
    assert reply.model == "chat-oa"
    assert {chunk.model for chunk in chunks} == {"chat-oa"}


# -- x-request-id --------------------------------------------------------------------------


async def test_the_request_id_is_accepted_forwarded_returned_and_logged(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama, log_stream: io.StringIO
) -> None:
    async with surface(fake_oa, fake_ol) as (_, client):
        given = {"x-request-id": "app-42.retry:1"}
        raw = await client.chat.completions.with_raw_response.create(
            model="chat-oa", messages=HELLO, extra_headers=given
        )
        ol_raw = await client.chat.completions.with_raw_response.create(
            model="chat-ol", messages=HELLO, extra_headers={"x-request-id": "ol-1"}
        )
        bad = await client.chat.completions.with_raw_response.create(
            model="chat-oa", messages=HELLO, extra_headers={"x-request-id": "spaces are bad"}
        )
        too_long = await client.chat.completions.with_raw_response.create(
            model="chat-oa", messages=HELLO, extra_headers={"x-request-id": "a" * 129}
        )
        with pytest.raises(openai.NotFoundError) as caught:
            await client.chat.completions.create(
                model="nope", messages=HELLO, extra_headers={"x-request-id": "err-1"}
            )
    assert raw.headers["x-request-id"] == "app-42.retry:1"
    assert fake_oa.requests[0].headers["x-request-id"] == "app-42.retry:1"
    assert ol_raw.headers["x-request-id"] == "ol-1"
    assert fake_ol.requests[-1].headers["x-request-id"] == "ol-1"
    generated = bad.headers["x-request-id"]
    assert generated != "spaces are bad"
    assert len(generated) == 32
    assert fake_oa.requests[1].headers["x-request-id"] == generated
    assert too_long.headers["x-request-id"] != "a" * 129
    assert caught.value.response.headers["x-request-id"] == "err-1"
    ids = [line["request_id"] for line in request_lines(log_stream)]
    assert ids == ["app-42.retry:1", "ol-1", generated, too_long.headers["x-request-id"], "err-1"]


async def test_health_answers_carry_a_request_id(fake_oa: FakeOpenAI, fake_ol: FakeOllama) -> None:
    async with surface(fake_oa, fake_ol) as (daemon, _), aiohttp.ClientSession() as session:
        base = daemon.openai_url.removesuffix("/v1")
        async with session.get(base + "/healthz", headers={"x-request-id": "hc-1"}) as r:
            assert r.headers["x-request-id"] == "hc-1"
        async with session.get(base + "/readyz") as r:
            assert len(r.headers["x-request-id"]) == 32


# -- cli usage estimates -------------------------------------------------------------------


async def test_a_cli_provider_reports_the_edges_estimate_marked_estimated(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama, log_stream: io.StringIO
) -> None:
    """``echo`` (cat) reports no usage: the answer, the usage chunk, the log line and
    iop_edge_tokens_total carry the edge's estimate, marked estimated."""
    text = "twelve bytes"  # 12 bytes: ceil(12/4) + 3 (one message) = 6 prompt tokens
    async with surface(fake_oa, fake_ol) as (daemon, client):
        reply = await client.chat.completions.create(model="echo", messages=user(text))
        stream = await client.chat.completions.create(
            model="echo",
            messages=user(text),
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        oa = await client.chat.completions.create(model="chat-oa", messages=HELLO)
        metrics = await scrape(daemon)
    # cat echoes the prompt: "twelve bytes\n", 13 bytes -> 4 completion tokens
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (6, 4)
    usage = chunks[-1].usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (6, 4)
    lines = request_lines(log_stream)
    assert [line["usage_estimated"] for line in lines] == [True, True, False]
    assert [line["prompt_tokens"] for line in lines] == [
        6,
        6,
        oa.usage.prompt_tokens if oa.usage else None,
    ]
    assert tokens(metrics, "iop_edge_tokens_total", "echo", "prompt") == 12
    assert tokens(metrics, "iop_edge_tokens_total", "echo", "completion") == 8
    assert tokens(metrics, "iop_edge_tokens_estimated_total", "echo", "prompt") == 12
    assert tokens(metrics, "iop_edge_tokens_estimated_total", "echo", "completion") == 8
    # reported usage is not marked: no estimated series for chat-oa
    assert tokens(metrics, "iop_edge_tokens_estimated_total", "chat-oa", "prompt") == 0
    assert tokens(metrics, "iop_edge_tokens_total", "chat-oa", "prompt") > 0


async def test_a_cli_that_reports_usage_is_not_estimated(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama, log_stream: io.StringIO
) -> None:
    async with surface(fake_oa, fake_ol) as (_, client):
        reply = await client.chat.completions.create(model="chat-cli", messages=HELLO)
    (line,) = request_lines(log_stream)
    assert line["usage_estimated"] is False
    assert reply.usage is not None
    assert line["prompt_tokens"] == reply.usage.prompt_tokens


# -- /v1/models ------------------------------------------------------------------------------


async def test_models_lists_groups_with_an_enabled_provider_only(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    doc = surface_doc(fake_oa, fake_ol)
    doc["nodes"][0]["providers"][1]["enabled"] = False  # lo: chat-ol has no other provider
    async with surface(fake_oa, fake_ol, doc) as (_, client):
        listed = [m.id async for m in client.models.list()]
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("chat-ol")
    assert listed == ["chat-oa", "chat-cli", "echo", "mixed", "local", "legacy"]


async def test_created_is_stable_across_a_reload(fake_oa: FakeOpenAI, fake_ol: FakeOllama) -> None:
    """A live reload (the daemon's apply path) keeps every model's ``created``; a model the
    reload adds is listed with a ``created`` no older than the others."""
    doc = surface_doc(fake_oa, fake_ol)
    async with surface(fake_oa, fake_ol, doc) as (daemon, client):
        before = {m.id: m.created async for m in client.models.list()}
        doc["models"].append({"id": "added", "context_window_tokens": 4096, "providers": ["up"]})
        daemon.apply_config(parse_config(doc))
        after = {m.id: m.created async for m in client.models.list()}
    assert {k: v for k, v in after.items() if k != "added"} == before
    assert after["added"] >= max(before.values())


async def test_a_route_to_an_ollama_adapter_embeds_and_refuses_what_it_cannot_honour(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    doc = surface_doc(fake_oa, fake_ol)
    doc["openai"]["model_routes"].append(
        {"model": "ol-route", "adapter": "ol", "target": "fake-model"}
    )
    async with surface(fake_oa, fake_ol, doc) as (_, client):
        reply = await client.embeddings.create(model="ol-route", input="routed")
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model="ol-route", messages=HELLO, n=2)
    assert reply.model == "ol-route"
    assert reply.data[0].embedding == fake_embedding("routed")
    assert (caught.value.code, caught.value.param) == ("unsupported_parameter", "n")
    assert "cannot be honoured by ollama adapter 'ol'" in caught.value.message
