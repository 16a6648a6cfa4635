"""``models[].aliases`` on the wire, ``GET /v1/models`` in both shapes, and ``x-api-key``
(issue 27): the official ``openai`` and ``anthropic`` SDKs against a real edge."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import aiohttp
import anthropic
import openai
import pytest

from iop_edge.daemon import Daemon
from iop_edge.testing.fake_ollama import FakeOllama
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers import doc_for, dump, edge_on, rename_save
from tests.helpers.api import OTHER_TOKEN, TOKEN, edge_doc, running_edge

HELLO: list[Any] = [{"role": "user", "content": "hello through the edge"}]
SONNET, HAIKU = "claude-sonnet-4-5", "claude-haiku-4-5"
#: every id the edge of these tests lists, in order: each alias right after its group
LISTED = ["chat-oa", SONNET, HAIKU, "chat-ol", "chat-cli", "echo", "legacy"]
#: what Anthropic's clients send with every request
VERSION = {"anthropic-version": "2023-06-01"}


def aliased_doc(fake_oa: FakeOpenAI, fake_ol: FakeOllama) -> dict[str, Any]:
    """The API tests' edge with two aliases on ``chat-oa`` (openai_compat, ``fake-model``)."""
    doc = edge_doc(fake_oa, fake_ol)
    doc["models"][0].update({"aliases": [SONNET, HAIKU], "display_name": "Chat OA"})
    return doc


@pytest.fixture
async def edge(fake_oa: FakeOpenAI, fake_ol: FakeOllama, log_stream: Any) -> AsyncIterator[Daemon]:
    async with running_edge(aliased_doc(fake_oa, fake_ol)) as daemon:
        yield daemon


@pytest.fixture
async def client(edge: Daemon) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=edge.openai_url, api_key=TOKEN, max_retries=0) as c:
        yield c


def anthropic_url(edge: Daemon) -> str:
    """The base URL Anthropic's SDK takes (it adds ``/v1/...`` itself)."""
    return edge.openai_url.removesuffix("/v1")


@pytest.fixture
async def claude(edge: Daemon) -> AsyncIterator[anthropic.AsyncAnthropic]:
    """Anthropic's SDK with the token as ``ANTHROPIC_API_KEY`` (sent as ``x-api-key``)."""
    async with anthropic.AsyncAnthropic(
        base_url=anthropic_url(edge), api_key=TOKEN, max_retries=0
    ) as sdk:
        yield sdk


async def get(edge: Daemon, path: str, headers: dict[str, str]) -> tuple[int, Any]:
    """Status and JSON body of ``GET path`` on the edge's API listener."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(anthropic_url(edge) + path, headers=headers) as response,
    ):
        return response.status, await response.json(content_type=None)


def request_lines(log_stream: Any) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    return [line for line in lines if line["event"] == "request"]


# --- an alias is its group --------------------------------------------------------------------


async def test_chat_through_an_alias_runs_on_its_group_and_answers_under_the_alias(
    client, fake_oa, log_stream
):
    reply = await client.chat.completions.create(model=SONNET, messages=HELLO)
    assert reply.model == SONNET
    assert reply.choices[0].message.content == "hello through the edge"
    assert fake_oa.requests[-1].json["model"] == "fake-model"  # the group's upstream target
    stream = await client.chat.completions.create(model=HAIKU, messages=HELLO, stream=True)
    models = {chunk.model async for chunk in stream}
    assert models == {HAIKU}
    lines = request_lines(log_stream)
    assert [(r["model"], r["provider"], r["code"]) for r in lines] == [
        (SONNET, "up", "ok"),
        (HAIKU, "up", "ok"),
    ]


async def test_an_alias_gets_its_groups_generation_policy(client, fake_oa):
    """``chat-oa`` sets default_max_tokens 64: a request through an alias gets it too."""
    await client.chat.completions.create(model=SONNET, messages=HELLO)
    assert fake_oa.requests[-1].json["max_tokens"] == 64


async def test_the_openai_listing_shows_each_alias_after_its_group(client):
    models = [m async for m in client.models.list()]
    assert [m.id for m in models] == LISTED
    by_id = {m.id: m for m in models}
    assert {by_id[name].owned_by for name in ("chat-oa", SONNET, HAIKU)} == {"iop-edge"}
    alias = await client.models.retrieve(SONNET)
    assert (alias.id, alias.object, alias.owned_by) == (SONNET, "model", "iop-edge")
    assert alias.model_dump()["display_name"] == "Chat OA"  # its group's


# --- Anthropic's shape ------------------------------------------------------------------------


async def test_the_anthropic_sdk_lists_the_models_in_anthropics_shape(client, claude):
    created = {m.id: m.created async for m in client.models.list()}
    page = await claude.models.list()
    assert [m.id for m in page.data] == LISTED
    assert (page.has_more, page.first_id, page.last_id) == (False, "chat-oa", "legacy")
    assert {m.type for m in page.data} == {"model"}
    by_id = {m.id: m for m in page.data}
    assert [by_id[name].display_name for name in ("chat-oa", SONNET, "echo", "legacy")] == [
        "Chat OA",
        "Chat OA",
        "echo",  # no display_name: Anthropic's field is required, so the id
        "legacy",
    ]
    for model in page.data:
        assert model.created_at == datetime.fromtimestamp(created[model.id], UTC)
        assert model.lifecycle == "active"
    assert by_id[SONNET].max_input_tokens == 4096  # the group's context window
    assert by_id["legacy"].max_input_tokens is None  # (a route's is not known)


async def test_the_anthropic_list_body_has_exactly_anthropics_keys(edge):
    status, body = await get(edge, "/v1/models", {"x-api-key": TOKEN, **VERSION})
    assert status == 200
    assert set(body) == {"data", "has_more", "first_id", "last_id"}
    assert body["data"][1] == {
        "type": "model",
        "id": SONNET,
        "display_name": "Chat OA",
        "created_at": body["data"][0]["created_at"],  # loaded together
        "lifecycle": "active",
        "max_input_tokens": 4096,
    }
    assert body["data"][0]["created_at"].endswith("Z")
    # Without anthropic-version, the same key gets OpenAI's shape.
    status, body = await get(edge, "/v1/models", {"x-api-key": TOKEN})
    assert (status, body["object"], [m["id"] for m in body["data"]]) == (200, "list", LISTED)


async def test_the_anthropic_listing_pages_as_anthropics_does(edge, claude):
    """``limit`` (default 20, 1–1000), ``after_id`` and ``before_id``; the SDK's
    auto-pagination walks every page."""
    assert [m.id async for m in claude.models.list(limit=2)] == LISTED
    headers = {"x-api-key": TOKEN, **VERSION}

    async def page(query: str) -> tuple[list[str], bool, str | None, str | None]:
        status, body = await get(edge, f"/v1/models?{query}", headers)
        assert status == 200, body
        ids = [m["id"] for m in body["data"]]
        return ids, body["has_more"], body["first_id"], body["last_id"]

    assert await page("limit=2") == (["chat-oa", SONNET], True, "chat-oa", SONNET)
    assert await page(f"limit=2&after_id={SONNET}") == ([HAIKU, "chat-ol"], True, HAIKU, "chat-ol")
    assert await page("limit=3&after_id=chat-cli") == (["echo", "legacy"], False, "echo", "legacy")
    assert await page("after_id=legacy") == ([], False, None, None)
    assert await page("limit=2&before_id=chat-ol") == ([SONNET, HAIKU], True, SONNET, HAIKU)
    assert await page(f"limit=2&before_id={HAIKU}") == (
        ["chat-oa", SONNET],
        False,
        "chat-oa",
        SONNET,
    )
    assert await page("limit=1000") == (LISTED, False, "chat-oa", "legacy")


@pytest.mark.parametrize(
    ("query", "param", "says"),
    [
        ("limit=0", "limit", "The limit '0' is not an integer from 1 to 1000."),
        ("limit=1001", "limit", "The limit '1001' is not an integer from 1 to 1000."),
        ("limit=two", "limit", "The limit 'two' is not an integer from 1 to 1000."),
        ("after_id=nope", "after_id", "The after_id 'nope' is not the id of a model"),
        ("before_id=nope", "before_id", "The before_id 'nope' is not the id of a model"),
    ],
)
async def test_a_bad_page_parameter_is_an_anthropic_400_naming_it(edge, query, param, says):
    status, body = await get(edge, f"/v1/models?{query}", {"x-api-key": TOKEN, **VERSION})
    assert status == 400
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith(says)
    assert param in body["error"]["message"]


async def test_the_anthropic_sdk_retrieves_a_model_and_an_alias(claude):
    model = await claude.models.retrieve(HAIKU)
    assert (model.id, model.type, model.display_name) == (HAIKU, "model", "Chat OA")
    assert (await claude.models.retrieve("legacy")).display_name == "legacy"
    with pytest.raises(anthropic.NotFoundError) as info:
        await claude.models.retrieve("claude-opus-4-1")
    assert info.value.status_code == 404
    assert info.value.body == {
        "type": "error",
        "error": {
            "type": "not_found_error",
            "message": "The model 'claude-opus-4-1' does not exist on this edge; GET /v1/models "
            "lists the models.",
        },
    }


# --- the token in x-api-key -------------------------------------------------------------------


async def test_the_token_may_come_as_x_api_key_or_as_a_bearer(edge, claude):
    """``ANTHROPIC_API_KEY`` sends ``x-api-key``, ``ANTHROPIC_AUTH_TOKEN`` a bearer token."""
    assert len((await claude.models.list()).data) == len(LISTED)
    async with anthropic.AsyncAnthropic(
        base_url=anthropic_url(edge), auth_token=TOKEN, max_retries=0
    ) as bearer:
        assert len((await bearer.models.list()).data) == len(LISTED)
    for headers in ({"x-api-key": TOKEN}, {"x-api-key": TOKEN, "Authorization": f"Bearer {TOKEN}"}):
        status, _ = await get(edge, "/v1/models", headers)  # the same token twice is fine
        assert status == 200
        status, _ = await get(edge, f"/v1/models/{SONNET}", headers)
        assert status == 200


async def test_a_wrong_x_api_key_is_an_anthropic_authentication_error(edge, log_stream):
    async with anthropic.AsyncAnthropic(
        base_url=anthropic_url(edge), api_key="not-a-token", max_retries=0
    ) as wrong:
        with pytest.raises(anthropic.AuthenticationError) as info:
            await wrong.models.list()
    assert info.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "Incorrect API key provided."},
    }
    (line,) = request_lines(log_stream)
    assert (line["status"], line["code"]) == (401, "invalid_api_key")
    assert "not-a-token" not in log_stream.getvalue()


async def test_two_different_tokens_in_authorization_and_x_api_key_are_refused(edge, log_stream):
    """Neither is silently preferred: 401 naming both headers, quoting neither token."""
    headers = {"Authorization": f"Bearer {TOKEN}", "x-api-key": OTHER_TOKEN}
    for extra in ({}, VERSION):
        status, body = await get(edge, "/v1/models", {**headers, **extra})
        assert status == 401
        message = body["error"]["message"]
        assert message == (
            "The Authorization and x-api-key headers hold different tokens: send the token "
            "in one of them (or the same token in both)."
        )
    assert body["type"] == "error"  # (the second time, in Anthropic's shape)
    text = log_stream.getvalue()
    assert TOKEN not in text
    assert OTHER_TOKEN not in text


@pytest.mark.parametrize(
    ("headers", "says"),
    [
        ({}, "Missing API key: send 'Authorization: Bearer <token>' or 'x-api-key: <token>'."),
        ({"x-api-key": "  "}, "Missing API key"),  # (empty: as if absent)
        ({"x-api-key": "tok\u00a0en"}, "The x-api-key header is malformed"),
        ({"x-api-key": TOKEN, "Authorization": "Basic abc"}, "The Authorization header holds no"),
    ],
)
async def test_a_missing_or_malformed_x_api_key_is_401(edge, headers, says):
    status, body = await get(edge, "/v1/models", headers)
    assert status == 401
    assert body["error"]["message"].startswith(says)
    assert body["error"]["code"] == "invalid_api_key"


# --- allow-lists --------------------------------------------------------------------------------


async def test_an_allow_list_admits_every_name_of_a_group_it_names_by_any(fake_oa, fake_ol):
    """Naming the group admits its aliases; naming an alias admits the group and its other
    aliases; nothing else (answered as an unknown model, as always)."""
    doc = aliased_doc(fake_oa, fake_ol)
    doc["openai"]["principal_tokens"][1]["principal_ref"] = "team-b"
    doc["provider_pool"]["principals"] = [
        {"ref": "team-a", "models": ["chat-oa"]},
        {"ref": "team-b", "models": [HAIKU, "echo"]},
    ]
    async with running_edge(doc) as edge:
        for token, listed in (
            (TOKEN, ["chat-oa", SONNET, HAIKU]),
            (OTHER_TOKEN, ["chat-oa", SONNET, HAIKU, "echo"]),
        ):
            async with openai.AsyncOpenAI(
                base_url=edge.openai_url, api_key=token, max_retries=0
            ) as sdk:
                assert [m.id async for m in sdk.models.list()] == listed
                for name in ("chat-oa", SONNET, HAIKU):
                    reply = await sdk.chat.completions.create(model=name, messages=HELLO)
                    assert reply.model == name
                with pytest.raises(openai.NotFoundError):
                    await sdk.chat.completions.create(model="chat-ol", messages=HELLO)
            async with anthropic.AsyncAnthropic(
                base_url=anthropic_url(edge), api_key=token, max_retries=0
            ) as claude:
                assert [m.id for m in (await claude.models.list()).data] == listed
                with pytest.raises(anthropic.NotFoundError):
                    await claude.models.retrieve("chat-ol")


# --- live reload --------------------------------------------------------------------------------


async def test_an_alias_added_by_a_reload_is_served_without_a_restart(tmp_path, fake_oa):
    async with (
        edge_on(tmp_path, doc_for(fake_oa)) as edge,
        openai.AsyncOpenAI(base_url=edge.daemon.openai_url, api_key="x", max_retries=0) as sdk,
    ):
        with pytest.raises(openai.NotFoundError):
            await sdk.chat.completions.create(model=SONNET, messages=HELLO)
        doc = doc_for(fake_oa)
        doc["models"][1]["aliases"] = [SONNET]
        rename_save(edge.path, dump(doc))
        record = await edge.next_record()
        assert record.result.result == "applied"
        assert [(e.path, e.change_class, e.applied) for e in record.result.report] == [
            ("models[chat].aliases", "live", True)
        ]
        reply = await sdk.chat.completions.create(model=SONNET, messages=HELLO)
        assert reply.model == SONNET
        assert fake_oa.requests[-1].json["model"] == "fake-model"
        assert [m.id async for m in sdk.models.list()] == ["echo", "chat", SONNET]
        metrics = await edge.metrics()
        counted = "iop_edge_requests_total[('code', 'ok'), ('model', 'claude-sonnet-4-5'), "
        assert metrics[counted + "('token_ref', 'anonymous')]"] == 1  # under the asked name
