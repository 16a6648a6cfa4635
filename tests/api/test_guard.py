"""Browser checks of the OpenAI surface (issue 10 item 7): ``Origin`` allow-list (with CORS for
the origins on it), loopback ``Host`` names on an open edge (DNS rebinding), and a JSON
``Content-Type`` for POST bodies. Real sockets, real clients; the SDK is unaffected."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from iop_edge.api.guard import is_loopback_host
from iop_edge.config import parse_config
from iop_edge.testing.fake_ollama import FakeOllama
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers.api import TOKEN, edge_doc, running_edge

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]
CHAT = {"model": "chat-oa", "messages": HELLO}
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("localhost:8080", True),
        ("LOCALHOST:8080", True),
        ("localhost.", True),
        ("127.0.0.1", True),
        ("127.0.0.1:8080", True),
        ("127.9.8.7:1", True),
        ("[::1]", True),
        ("[::1]:8080", True),
        ("[0:0:0:0:0:0:0:1]:80", True),
        ("evil.example", False),
        ("evil.example:8080", False),
        ("localhost.evil.example", False),
        ("127.0.0.1.evil.example", False),
        ("127.0.0.1:80:80", False),
        ("127.0.0.1:８０", False),
        ("127.1", False),
        ("128.0.0.1", False),
        ("0.0.0.0", False),
        ("10.0.0.5:8080", False),
        ("[::2]:80", False),
        ("[::1]x", False),
        ("[::1", False),
        ("", False),
    ],
)
def test_loopback_host_names(host, loopback):
    assert is_loopback_host(host) is loopback


async def post(
    url: str, body: Any, headers: dict[str, str], *, raw: bool = False
) -> tuple[int, dict[str, Any], aiohttp.typedefs.LooseHeaders]:
    data = body if raw else json.dumps(body)
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=data, headers=headers) as response,
    ):
        return response.status, await response.json(content_type=None), response.headers


async def get(url: str, headers: dict[str, str]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as response:
        return response.status, await response.json(content_type=None)


# --- Content-Type ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content_type", "shown"),
    [
        ("application/x-www-form-urlencoded", "'application/x-www-form-urlencoded'"),
        ("text/plain;charset=UTF-8", "'text/plain;charset=UTF-8'"),
        ("multipart/form-data; boundary=x", "'multipart/form-data; boundary=x'"),
        ("application/octet-stream", "'application/octet-stream'"),
        ("application/jsonx", "'application/jsonx'"),
    ],
)
async def test_a_post_body_not_declared_json_is_415_naming_the_header_and_value(
    edge, log_stream, content_type, shown
):
    status, body, _ = await post(
        edge.openai_url + "/chat/completions", CHAT, {**AUTH, "Content-Type": content_type}
    )
    assert status == 415
    error = body["error"]
    assert (error["code"], error["type"]) == ("unsupported_media_type", "invalid_request_error")
    assert "'Content-Type: application/json'" in error["message"]
    assert f"Content-Type: {shown}" in error["message"]
    line = [json.loads(x) for x in log_stream.getvalue().splitlines() if '"request"' in x][-1]
    assert (line["status"], line["code"]) == (415, "unsupported_media_type")
    assert edge.scheduler.statistics().submitted == 0  # refused before admission


async def test_a_body_without_any_content_type_is_415(edge):
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            edge.openai_url + "/chat/completions",
            data=json.dumps(CHAT).encode(),
            headers=AUTH,
            skip_auto_headers=["Content-Type"],
        ) as response,
    ):
        assert "Content-Type" not in response.request_info.headers
        body = await response.json()
    assert response.status == 415
    assert "(this request sent no Content-Type header)" in body["error"]["message"]


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON ; charset=UTF-8",
        "application/merge-patch+json",
    ],
)
async def test_json_content_types_are_accepted(edge, content_type):
    status, body, _ = await post(
        edge.openai_url + "/chat/completions", CHAT, {**AUTH, "Content-Type": content_type}
    )
    assert status == 200, body
    assert body["choices"][0]["message"]["content"]


async def test_an_unauthenticated_form_post_is_401_first(edge):
    """Authentication comes before the body checks: a stranger learns nothing more."""
    status, body, _ = await post(
        edge.openai_url + "/chat/completions",
        "model=chat-oa",
        {"Content-Type": "application/x-www-form-urlencoded"},
        raw=True,
    )
    assert (status, body["error"]["code"]) == (401, "invalid_api_key")


# --- Origin ------------------------------------------------------------------------------------


async def test_a_browser_origin_not_on_the_allow_list_is_403(edge, log_stream):
    headers = {**AUTH, "Origin": "https://evil.example", "Content-Type": "application/json"}
    status, body, _ = await post(edge.openai_url + "/chat/completions", CHAT, headers)
    assert status == 403
    error = body["error"]
    assert (error["code"], error["type"]) == ("origin_not_allowed", "permission_error")
    assert "'https://evil.example'" in error["message"]
    assert "openai.allowed_origins" in error["message"]
    for path in ("/models", "/models/chat-oa"):
        status, body = await get(edge.openai_url + path, headers)
        assert (status, body["error"]["code"]) == (403, "origin_not_allowed")
    assert edge.scheduler.statistics().submitted == 0


async def test_an_allowed_origin_is_served_with_cors(fake_oa, fake_ol, log_stream):
    doc = edge_doc(fake_oa, fake_ol)
    doc["openai"]["allowed_origins"] = ["HTTPS://Chat.Example.com:443/", "http://localhost:3000"]
    async with running_edge(doc) as daemon:
        assert daemon.config.openai.allowed_origins == (
            "https://chat.example.com",
            "http://localhost:3000",
        )
        url = daemon.openai_url + "/chat/completions"
        origin = {"Origin": "https://chat.example.com"}
        async with aiohttp.ClientSession() as session:
            async with session.options(
                url,
                headers={
                    **origin,
                    "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": "authorization, content-type",
                },
            ) as preflight:
                assert preflight.status == 204
                assert preflight.headers["Access-Control-Allow-Origin"] == origin["Origin"]
                assert preflight.headers["Access-Control-Allow-Methods"] == "GET, POST"
                allowed = preflight.headers["Access-Control-Allow-Headers"]
                assert "Authorization" in allowed
                assert "Content-Type" in allowed
                assert "X-IOP-Provider-Authorization" in allowed
            async with session.post(url, json=CHAT, headers={**AUTH, **origin}) as response:
                assert response.status == 200
                assert response.headers["Access-Control-Allow-Origin"] == origin["Origin"]
                assert "x-request-id" in response.headers["Access-Control-Expose-Headers"]
                assert response.headers["Vary"] == "Origin"
            other = {"Origin": "https://evil.example"}
            async with session.options(url, headers=other) as preflight:
                assert preflight.status == 403
                assert "Access-Control-Allow-Origin" not in preflight.headers
            async with session.post(url, json=CHAT, headers={**AUTH, **other}) as response:
                assert response.status == 403
                assert "Access-Control-Allow-Origin" not in response.headers
            # the browser's serialisation only: no case folding, no default port on the wire
            upper = {"Origin": "HTTPS://chat.example.com"}
            async with session.post(url, json=CHAT, headers={**AUTH, **upper}) as response:
                assert response.status == 403


async def test_without_allowed_origins_there_is_no_cors_at_all(edge):
    async with (
        aiohttp.ClientSession() as session,
        session.options(
            edge.openai_url + "/chat/completions", headers={"Origin": "https://a.example"}
        ) as response,
    ):
        assert response.status == 405  # no preflight route: nothing is granted
        assert "Access-Control-Allow-Origin" not in response.headers


# --- Host (DNS rebinding) ----------------------------------------------------------------------


def open_doc(fake_oa: FakeOpenAI, fake_ol: FakeOllama, **openai_fields: Any) -> dict[str, Any]:
    """edge_doc() without principal tokens (an open edge), with extra ``openai`` fields."""
    doc = edge_doc(fake_oa, fake_ol)
    doc["openai"].pop("principal_tokens")
    doc["openai"].update(openai_fields)
    return doc


async def test_an_open_edge_answers_only_loopback_host_names(fake_oa, fake_ol, log_stream):
    """A page whose name was rebound to 127.0.0.1 sends its own name as Host: refused, so it
    cannot run a provider and read the answer; the edge's own names work."""
    async with running_edge(open_doc(fake_oa, fake_ol)) as daemon:
        rebound = {"Host": "evil.example:8080", "Content-Type": "application/json"}
        status, body, _ = await post(daemon.openai_url + "/chat/completions", CHAT, rebound)
        assert status == 403
        error = body["error"]
        assert error["code"] == "host_not_allowed"
        assert "'evil.example:8080'" in error["message"]
        assert "openai.principal_tokens" in error["message"]
        assert (await get(daemon.openai_url + "/models", rebound))[0] == 403
        port = daemon.listeners["openai"].port
        for host in ("localhost", f"localhost:{port}", "127.0.0.2", "[::1]:9", "LocalHost:1"):
            status, body = await get(daemon.openai_url + "/models", {"Host": host})
            assert status == 200, (host, body)
        async with (
            aiohttp.ClientSession() as session,
            session.get(daemon.openai_url[:-3] + "/healthz", headers=rebound) as health,
        ):
            assert health.status == 200  # health says nothing; probes use any name
        assert daemon.scheduler.statistics().submitted == 0


async def test_with_principal_tokens_any_host_name_is_served(edge):
    status, body, _ = await post(
        edge.openai_url + "/chat/completions",
        CHAT,
        {**AUTH, "Host": "edge.example.net", "Content-Type": "application/json"},
    )
    assert status == 200, body


async def test_the_sdk_passes_every_check(fake_oa, fake_ol):
    """The openai SDK sends JSON, no Origin, and a loopback Host: an open loopback edge and an
    edge with an allow-list serve it as before."""
    doc = open_doc(fake_oa, fake_ol, allowed_origins=["https://app.example"])
    async with (
        running_edge(doc) as daemon,
        openai.AsyncOpenAI(base_url=daemon.openai_url, api_key="x", max_retries=0) as client,
    ):
        reply = await client.chat.completions.create(model="chat-oa", messages=HELLO)
        assert reply.choices[0].message.content
        assert [m.id async for m in client.models.list()]


def test_allowed_origins_must_be_origins():
    from iop_edge.errors import ConfigError

    base = {"models": [], "openai": {"model_routes": []}}
    for bad in ("*", "https://*.example", "app.example", "ftp://x.example", "https://a/b",
                "https://a?x=1", "https://user@a", "https://a:99999", "null"):  # fmt: skip
        with pytest.raises(ConfigError) as caught:
            parse_config({**base, "openai": {"allowed_origins": [bad]}})
        problem = caught.value.problems[0]
        assert problem.path.startswith("openai.allowed_origins")
        assert "is not an origin" in problem.message
        assert "http(s)://host[:port]" in problem.message
