"""What a request's log line and ``iop_edge_requests_total`` say (issue 25): an upstream's own
4xx is ``client_error`` (it refused the request, it did not fail), an allow-list denial says why
in the log while the client gets the unknown model's 404, and a refused ``GET /v1/models`` (or
``/v1/models/{id}``) is logged and counted like any other request."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from iop_edge.tokens import token_hash
from tests.helpers import doc_for, edge_on

TOKEN = "iop_token-of-team-a"
HELLO: Any = [{"role": "user", "content": "hello"}]


def request_lines(log_stream: io.StringIO) -> list[dict[str, Any]]:
    lines = (json.loads(line) for line in log_stream.getvalue().splitlines() if line.strip())
    return [line for line in lines if line.get("event") == "request"]


def with_token(doc: dict[str, Any], **principal: Any) -> dict[str, Any]:
    """``doc`` with one token (``app``, principal ``team-a``) and that principal's policy."""
    doc["openai"]["principal_tokens"] = [
        {"token_ref": "app", "token_hash_sha256": token_hash(TOKEN), "principal_ref": "team-a"}
    ]
    doc["provider_pool"]["principals"] = [{"ref": "team-a", **principal}]
    return doc


async def test_an_upstream_4xx_is_counted_and_logged_as_client_error(
    tmp_path: Path, log_stream: io.StringIO
) -> None:
    """The upstream answers 400: the client gets it as is; the request counts under
    ``code="client_error"`` (as the provider's attempt does), never ``upstream_error``, and its
    log line is at ``info`` (docs/operations.md, "Logs")."""
    fake = FakeOpenAI(behavior=FakeBehavior(status=400, error_message="bad temperature"))
    async with fake, edge_on(tmp_path, doc_for(fake)) as edge:
        url = edge.daemon.openai_url
        async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0) as client:
            with pytest.raises(openai.BadRequestError):
                await client.chat.completions.create(model="chat", messages=HELLO)
        metrics = await edge.metrics()
    base = "iop_edge_requests_total[('code', '{}'), ('model', 'chat'), ('token_ref', 'anonymous')]"
    assert metrics[base.format("client_error")] == 1
    assert base.format("upstream_error") not in metrics
    [line] = request_lines(log_stream)
    assert (line["status"], line["code"], line["level"]) == (400, "client_error", "info")
    assert "bad temperature" in line["error"]


async def test_an_allow_list_denial_is_a_404_whose_log_line_says_why(
    tmp_path: Path, log_stream: io.StringIO
) -> None:
    """The principal may use ``echo`` only: asking for ``chat`` gets exactly the unknown
    model's answer, while the log line names the principal, the model and the rule."""
    async with (
        FakeOpenAI() as fake,
        edge_on(tmp_path, with_token(doc_for(fake), models=["echo"])) as edge,
    ):
        url = edge.daemon.openai_url
        async with openai.AsyncOpenAI(base_url=url, api_key=TOKEN, max_retries=0) as client:
            with pytest.raises(openai.NotFoundError) as denied:
                await client.chat.completions.create(model="chat", messages=HELLO)
            with pytest.raises(openai.NotFoundError) as unknown:
                await client.chat.completions.create(model="nope", messages=HELLO)
    denied_body: Any = denied.value.body
    unknown_body: Any = unknown.value.body
    assert denied_body == {
        **unknown_body,
        "message": unknown_body["message"].replace("nope", "chat"),
    }

    refused, absent = request_lines(log_stream)
    assert (refused["status"], refused["code"]) == (absent["status"], absent["code"])
    assert refused["error"] == (
        "the principal 'team-a' may not use the model 'chat' "
        "(provider_pool.principals[team-a].models); answered as an unknown model"
    )
    assert "does not exist" in absent["error"]


@pytest.mark.parametrize("path", ["/models", "/models/chat"])
async def test_a_refused_models_request_is_logged_and_counted(
    tmp_path: Path, log_stream: io.StringIO, path: str
) -> None:
    async with FakeOpenAI() as fake, edge_on(tmp_path, with_token(doc_for(fake))) as edge:
        url = edge.daemon.openai_url + path
        async with aiohttp.ClientSession() as session:
            for authorization in ({}, {"Authorization": "Bearer iop_wrong"}):
                async with session.get(url, headers=authorization) as response:
                    assert response.status == 401
                    assert (await response.json())["error"]["code"] == "invalid_api_key"
            async with session.get(url, headers={"Authorization": f"Bearer {TOKEN}"}) as ok:
                assert ok.status == 200  # (an answer is not a use of a model: not counted)
        metrics = await edge.metrics()
    key = (
        "iop_edge_requests_total[('code', 'invalid_api_key'), ('model', '(unknown)'), "
        "('token_ref', '(none)')]"
    )
    assert metrics[key] == 2
    lines = request_lines(log_stream)
    assert [(x["endpoint"], x["status"], x["code"]) for x in lines] == [
        ("models", 401, "invalid_api_key")
    ] * 2
    assert all(x["path"] == f"/v1{path}" and x["method"] == "GET" for x in lines)
    assert "iop_wrong" not in log_stream.getvalue()
