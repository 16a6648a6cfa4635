"""Issue 10 item 9: statuses an HTTP upstream may answer besides 200 and its own errors.

200 is an answer, 400–599 the upstream's error (relayed with its status); anything else — a
101 (which used to hang the client), a 205 (which used to become a 200), any other 2xx, a
redirect (never followed), a status past 599 or under 100 — is a 502 ``upstream_error`` whose
message names what came back. Served by a raw socket upstream: no framework sends these.
"""

# ruff: noqa: E501 - the case tables read best one row per line

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest

from iop_edge.adapters import AdapterSet, UpstreamReply
from iop_edge.errors import AdapterError
from tests.helpers.adapters import chat
from tests.helpers.upstreams import raw_upstream

SetFactory = Callable[..., AdapterSet]

COMPLETION = (
    b'{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}'
)
OLLAMA_ANSWER = b'{"model":"m","message":{"role":"assistant","content":"hi"},"done":true}'


def answer(status_line: str, body: bytes, *extra: str) -> bytes:
    """A raw HTTP/1.1 response with a JSON body (or none)."""
    head = [status_line, *extra]
    if body:
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


# (id, status line, extra headers, with a body): what must never pass for an answer.
UNEXPECTED: list[tuple[str, str, tuple[str, ...], bool]] = [
    ("101-upgrade", "HTTP/1.1 101 Switching Protocols", ("Upgrade: websocket", "Connection: Upgrade"), False),
    ("101-bare", "HTTP/1.1 101 Switching Protocols", (), False),
    ("201", "HTTP/1.1 201 Created", (), True),
    ("204", "HTTP/1.1 204 No Content", (), False),
    ("205", "HTTP/1.1 205 Reset Content", (), True),
    ("301", "HTTP/1.1 301 Moved Permanently", ("Location: {redirect}",), True),
    ("302", "HTTP/1.1 302 Found", ("Location: {redirect}",), True),
    ("307", "HTTP/1.1 307 Temporary Redirect", ("Location: {redirect}",), True),
    ("308", "HTTP/1.1 308 Permanent Redirect", ("Location: {redirect}",), True),
    ("600", "HTTP/1.1 600 Beyond", (), True),
    ("999", "HTTP/1.1 999 Weird", (), True),
    ("099", "HTTP/1.1 099 Low", (), True),
]  # fmt: skip


def adapter_set(sets: SetFactory, kind: str, base_url: str) -> AdapterSet:
    url = f"{base_url}/v1" if kind == "openai_compat" else base_url
    return sets(
        [{"name": "a", "type": kind, "base_url": url}],
        [{"id": "p1", "type": kind, "adapter": "a"}],
    )


@pytest.mark.parametrize("kind", ["openai_compat", "ollama"])
@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
@pytest.mark.parametrize(
    ("status_line", "extra", "with_body"),
    [pytest.param(*row[1:], id=row[0]) for row in UNEXPECTED],
)
async def test_an_unexpected_upstream_status_is_a_502_naming_it(
    sets: SetFactory, kind: str, stream: bool, status_line: str, extra: Any, with_body: bool
) -> None:
    body = (COMPLETION if kind == "openai_compat" else OLLAMA_ANSWER) if with_body else b""
    async with raw_upstream(answer("HTTP/1.1 200 OK", body)) as elsewhere:
        headers = tuple(
            h.format(redirect=f"{elsewhere.base_url}/v1/chat/completions") for h in extra
        )
        async with raw_upstream(answer(status_line, body, *headers)) as upstream:
            executor = adapter_set(sets, kind, upstream.base_url).for_provider("p1")
            call = chat(stream=stream)
            with pytest.raises(AdapterError) as caught:
                await (executor.open_stream(call) if stream else executor.complete(call))
            assert upstream.requests == 1
        assert elsewhere.requests == 0  # a redirect is never followed
    error = caught.value
    assert (error.code, error.status) == ("upstream_error", 502)
    status = status_line.split()[1].lstrip("0")
    assert f"answered HTTP {status} " in str(error)
    assert "provider 'p1'" in str(error)


@pytest.mark.parametrize("kind", ["openai_compat", "ollama"])
async def test_a_200_answer_still_passes(sets: SetFactory, kind: str) -> None:
    """The control row: the same raw upstream answering 200 is an answer."""
    body = COMPLETION if kind == "openai_compat" else OLLAMA_ANSWER
    async with raw_upstream(answer("HTTP/1.1 200 OK", body)) as upstream:
        reply = await adapter_set(sets, kind, upstream.base_url).for_provider("p1").complete(chat())
    assert isinstance(reply, UpstreamReply)
    assert reply.status == 200


ENVELOPE_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    418: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    599: "server_error",
}
"""The ``type`` a wrapped upstream error gets: the same table as the edge's own errors (before
issue 11 a wrapped 401 or 429 said ``invalid_request_error``)."""


@pytest.mark.parametrize("kind", ["openai_compat", "ollama"])
@pytest.mark.parametrize("status", sorted(ENVELOPE_TYPES))
async def test_an_error_status_is_relayed_with_its_status_and_the_page_kept_for_the_log(
    sets: SetFactory, kind: str, status: int
) -> None:
    page = b"<html><body><h1>Upstream says no</h1><p>internal host 10.1.2.3</p></body></html>"
    raw = (
        f"HTTP/1.1 {status} Whatever\r\nContent-Type: text/html\r\n"
        f"Content-Length: {len(page)}\r\n\r\n"
    ).encode() + page
    async with raw_upstream(raw) as upstream:
        executor = adapter_set(sets, kind, upstream.base_url).for_provider("p1")
        reply = await executor.complete(chat())
        streamed = await executor.open_stream(chat(stream=True))
    for got in (reply, streamed):
        assert isinstance(got, UpstreamReply)
        assert got.status == status
        assert b"10.1.2.3" not in got.body
        assert b"html" not in got.body
        error = orjson.loads(got.body)["error"]
        assert (error["type"], error["code"]) == (ENVELOPE_TYPES[status], "upstream_error")
        assert got.detail == (
            f"the upstream answered {status} Whatever: <html><body><h1>Upstream says no</h1>"
            "<p>internal host 10.1.2.3</p></body></html>"
        )
