"""Upstream faults through each adapter, through the whole daemon, as a client sees them.

One row per (adapter, fault, streaming or not) that ``tests/adapters/`` (adapter level) and
``tests/api/test_server.py`` do not already cover end to end. Each row asserts the documented
answer — the status and OpenAI error ``code`` of the error table of docs/api.md, or for a failure
after the stream started a final ``data: {"error": ...}`` event with that code and no
``[DONE]`` — then that the slot was released exactly once, the upstream connection was let go,
and no process is left behind.
"""

# ruff: noqa: E501 - the fault table reads best one row per line

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest

from iop_edge.config import parse_config
from iop_edge.daemon import Daemon
from iop_edge.testing.fake_behavior import FakeBehavior
from tests.helpers import FAKE_CLI, process_gone, settled, wait_for
from tests.helpers.upstreams import closed_port, raw_upstream

SHORT_MS = 300
"""``request_timeout_ms`` of the ``-short`` providers: the stall and hang rows wait this long."""


def closed_port_url(path: str = "") -> str:
    """A loopback URL where nothing listens (connection refused)."""
    return f"http://127.0.0.1:{closed_port()}{path}"


def fault_doc(oa_url: str, ol_url: str) -> dict[str, Any]:
    """One model per (adapter, timeout) so rows never share slots: ``oa``/``ol``/``cli`` with
    a 10 s timeout, ``*-short`` with :data:`SHORT_MS`, ``*-down`` where nothing answers."""
    providers: list[dict[str, Any]] = []
    models: list[dict[str, Any]] = []

    def add(pid: str, kind: str, adapter: str, **fields: Any) -> None:
        providers.append(
            {
                "id": pid,
                "type": kind,
                "category": "cli" if kind == "cli" else "local_inference",
                "adapter": adapter,
                "models": ["fake-model"],
                "capacity": 2,
                **fields,
            }
        )
        models.append({"id": pid, "context_window_tokens": 4096, "providers": [pid]})

    agent = {
        "command": FAKE_CLI[0],
        "args": [*FAKE_CLI[1:], "--format", "stream-json"],
        "output_format": "stream-json",
    }
    add("oa", "openai_compat", "oa", request_timeout_ms=10000)
    add("oa-short", "openai_compat", "oa", request_timeout_ms=SHORT_MS)
    add("oa-down", "openai_compat", "oa", base_url=closed_port_url("/v1"))
    add("ol", "ollama", "ol", request_timeout_ms=10000)
    add("ol-short", "ollama", "ol", request_timeout_ms=SHORT_MS)
    add("ol-down", "ollama", "ol", base_url=closed_port_url())
    add("cli", "cli", "shell", request_timeout_ms=10000, **agent)
    add("cli-short", "cli", "shell", request_timeout_ms=SHORT_MS, **agent)
    add("cli-missing", "cli", "shell", command="/nonexistent/agent-binary")
    return {
        "openai": {"listen": "127.0.0.1:0"},
        "metrics": {"enabled": False},
        "console": {"enabled": False},
        "provider_pool": {"max_queue": 4, "queue_timeout_ms": 30000},
        "models": models,
        "nodes": [
            {
                "id": "n1",
                "adapters": [
                    {"name": "oa", "type": "openai_compat", "base_url": oa_url},
                    {"name": "ol", "type": "ollama", "base_url": ol_url},
                    {"name": "shell", "type": "cli", "command": "cat"},
                ],
                "providers": providers,
            }
        ],
    }


@dataclass(frozen=True)
class Outcome:
    """What the client must see: ``status`` and ``code`` of the HTTP answer, or (``in_stream``)
    a 200 stream whose last event is an error with ``code``; ``code=None`` with 200 is the
    echoed answer."""

    status: int
    code: str | None
    in_stream: bool = False


OK = Outcome(200, None)


def fake(**fields: Any) -> str:
    """A ``[[fake:...]]`` directive for the HTTP fakes."""
    return FakeBehavior(**fields).directive()


def cli(options: str) -> str:
    """A ``[[fake-cli: ...]]`` directive for the fake agent."""
    return f"[[fake-cli: {options}]]"


ERR, TIMEOUT = "upstream_error", "upstream_timeout"
FLOOD = 9 * 1024 * 1024  # over the 8 MiB stdout cap

# (id, model, directive, stream, expected)
ROWS: list[tuple[str, str, str, bool, Outcome]] = [
    # connection refused (the OpenAI-compatible non-streaming row is in test_server)
    ("oa-refused-stream", "oa-down", "", True, Outcome(502, ERR)),
    ("ol-refused", "ol-down", "", False, Outcome(502, ERR)),
    ("ol-refused-stream", "ol-down", "", True, Outcome(502, ERR)),
    ("cli-missing", "cli-missing", "", False, Outcome(502, ERR)),
    ("cli-missing-stream", "cli-missing", "", True, Outcome(502, ERR)),
    # the upstream's own HTTP error passes through with its status (and its code, if any)
    ("oa-503-stream", "oa", fake(status=503, error_code="overloaded"), True, Outcome(503, "overloaded")),
    ("oa-400", "oa", fake(status=400, error_code="bad_thing"), False, Outcome(400, "bad_thing")),
    ("ol-500", "ol", fake(status=500), False, Outcome(500, None)),
    ("ol-500-stream", "ol", fake(status=500), True, Outcome(500, None)),
    # disconnect before any byte
    ("oa-disconnect-stream", "oa", fake(fault="disconnect"), True, Outcome(502, ERR)),
    ("ol-disconnect", "ol", fake(fault="disconnect"), False, Outcome(502, ERR)),
    # reset mid-body / mid-stream
    ("oa-reset-body", "oa", fake(fault="reset", fault_after=1), False, Outcome(502, ERR)),
    ("ol-reset-body", "ol", fake(fault="reset", fault_after=1), False, Outcome(502, ERR)),
    ("ol-reset-stream", "ol", fake(fault="reset", fault_after=2), True, Outcome(200, ERR, True)),
    # stall (timeout via request_timeout_ms)
    ("oa-stall-stream", "oa-short", fake(fault="stall", fault_after=2), True, Outcome(200, TIMEOUT, True)),
    ("oa-stall-body", "oa-short", fake(fault="stall", fault_after=1), False, Outcome(504, TIMEOUT)),
    ("ol-stall", "ol-short", fake(fault="stall", fault_after=0), False, Outcome(504, TIMEOUT)),
    ("ol-stall-stream", "ol-short", fake(fault="stall", fault_after=2), True, Outcome(200, TIMEOUT, True)),
    ("oa-slow-headers", "oa-short", fake(latency=1.0), False, Outcome(504, TIMEOUT)),
    # slow first byte within the timeout: success
    ("oa-slow-first-byte", "oa", fake(first_chunk_delay=0.3), False, OK),
    ("oa-slow-first-byte-stream", "oa", fake(first_chunk_delay=0.3), True, OK),
    ("ol-slow-first-byte", "ol", fake(first_chunk_delay=0.3), False, OK),
    ("ol-slow-first-byte-stream", "ol", fake(latency=0.3), True, OK),
    ("cli-slow-first-byte", "cli", cli("--sleep 0.3"), False, OK),
    ("cli-slow-first-byte-stream", "cli", cli("--sleep 0.3 --chunk-delay 0.05"), True, OK),
    # malformed JSON / SSE / NDJSON, and an error event inside the stream
    ("oa-malformed-body", "oa", fake(fault="malformed"), False, Outcome(502, ERR)),
    ("oa-malformed-sse", "oa", fake(fault="malformed", fault_after=2), True, Outcome(200, ERR, True)),
    ("oa-error-event", "oa", fake(fault="error", fault_after=2), True, Outcome(200, ERR, True)),
    ("ol-malformed-body", "ol", fake(fault="malformed"), False, Outcome(502, ERR)),
    ("ol-malformed-ndjson", "ol", fake(fault="malformed", fault_after=2), True, Outcome(200, ERR, True)),
    ("ol-error-line", "ol", fake(fault="error", fault_after=2), True, Outcome(200, ERR, True)),
    ("cli-malformed", "cli", cli("--format text"), False, Outcome(502, ERR)),
    ("cli-malformed-stream", "cli", cli("--format text"), True, Outcome(502, ERR)),
    # a CLI that crashes, hangs or floods stdout
    ("cli-crash-stream", "cli", cli("--exit-code 3 --stderr boom"), True, Outcome(502, ERR)),
    ("cli-crash-after-output", "cli", cli("--answer-then-exit --exit-code 3"), False, Outcome(502, ERR)),
    ("cli-crash-mid-stream", "cli", cli("--answer-then-exit --exit-code 3"), True, Outcome(200, ERR, True)),
    ("cli-hang-stream", "cli-short", cli("--hang"), True, Outcome(504, TIMEOUT)),
    ("cli-hang-mid-stream", "cli-short", cli("--hang-after 1"), True, Outcome(200, TIMEOUT, True)),
    ("cli-hang-ignoring-sigterm", "cli-short", cli("--hang --ignore-sigterm"), False, Outcome(504, TIMEOUT)),
    ("cli-flood", "cli", cli(f"--flood {FLOOD}"), False, Outcome(502, ERR)),
    ("cli-flood-stream", "cli", cli(f"--flood {FLOOD}"), True, Outcome(502, ERR)),
]  # fmt: skip


async def ask(url: str, model: str, content: str, stream: bool) -> tuple[int, dict[str, Any]]:
    """POST one chat request with raw aiohttp; return the status and what the client got:
    ``{"error": ...}`` of an error body or of the stream's last event, or the answer text."""
    body = {"model": model, "stream": stream, "messages": [{"role": "user", "content": content}]}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/chat/completions", json=body) as response,
    ):
        raw = await response.read()
    if not stream or response.status != 200:
        return response.status, orjson.loads(raw)
    events = [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: ")]
    if events[-1] != b"[DONE]":
        return 200, orjson.loads(events[-1])
    text = ""
    for event in events[:-1]:
        for choice in orjson.loads(event).get("choices") or ():
            text += choice["delta"].get("content") or ""
    return 200, {"text": text}


@pytest.mark.parametrize(
    ("model", "content", "stream", "expected"),
    [pytest.param(*row[1:], id=row[0]) for row in ROWS],
)
async def test_an_upstream_fault_gives_the_documented_error_and_leaks_nothing(
    fake_oa, fake_ol, model, content, stream, expected
):
    """The row's fault, end to end: the documented answer, the slot released once, the
    upstream connection gone (the fake counts nothing in flight), no CLI process left."""
    daemon = Daemon(parse_config(fault_doc(fake_oa.base_url, fake_ol.base_url)))
    await daemon.start()
    try:
        status, got = await ask(daemon.openai_url, model, f"{content} hello edge", stream)
        await wait_for(lambda: fake_oa.in_flight == 0 and fake_ol.in_flight == 0)
        stats = await settled(daemon)
    finally:
        await daemon.stop()
    assert status == expected.status
    if expected.code is None and status == 200:
        assert (got.get("text") or got["choices"][0]["message"]["content"]).strip() == "hello edge"
    else:
        assert set(got["error"]) == {"message", "type", "param", "code"}
        assert got["error"]["code"] == expected.code
    assert (stats.admitted, stats.released, stats.double_releases) == (1, 1, 0)


async def test_a_hung_cli_with_a_child_is_killed_with_its_whole_group_mid_stream(
    fake_oa, fake_ol, tmp_path
):
    """A stream whose agent hangs after one chunk, having forked a child into its group: the
    client gets the ``upstream_timeout`` event, and both processes are gone."""
    pid_file = tmp_path / "child.pid"
    daemon = Daemon(parse_config(fault_doc(fake_oa.base_url, fake_ol.base_url)))
    await daemon.start()
    try:
        directive = cli(f"--hang-after 1 --spawn-child --pid-file {pid_file}")
        status, got = await ask(daemon.openai_url, "cli-short", f"{directive} hi there", True)
        await settled(daemon)
    finally:
        await daemon.stop()
    assert (status, got["error"]["code"]) == (200, "upstream_timeout")
    child = int(pid_file.read_text())
    await wait_for(lambda: process_gone(child))


# --- statuses no framework sends, and error pages (issue 10) ---------------------------------

COMPLETION = (
    b'{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}'
)
HTML_PAGE = b"<html><body><h1>502 Bad Gateway</h1><hr>nginx/1.25 on gw-7.internal</body></html>"


def raw_answer(status_line: str, body: bytes, content_type: str = "application/json") -> bytes:
    head = f"{status_line}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


# (id, raw answer, stream, client status, client code, what the log line's error must hold)
RAW_ROWS: list[tuple[str, bytes, bool, int, str, str]] = [
    ("101", b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", False, 502, ERR, "answered HTTP 101 Switching Protocols"),
    ("101-stream", b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", True, 502, ERR, "answered HTTP 101"),
    ("205", raw_answer("HTTP/1.1 205 Reset Content", COMPLETION), False, 502, ERR, "answered HTTP 205 Reset Content"),
    ("302", raw_answer("HTTP/1.1 302 Found", COMPLETION).replace(b"\r\n\r\n", b"\r\nLocation: http://127.0.0.1:9/\r\n\r\n", 1), False, 502, ERR, "answered HTTP 302 Found"),
    ("999", raw_answer("HTTP/1.1 999 Weird", COMPLETION), False, 502, ERR, "answered HTTP 999 Weird"),
    ("999-stream", raw_answer("HTTP/1.1 999 Weird", COMPLETION), True, 502, ERR, "answered HTTP 999 Weird"),
    ("html-500", raw_answer("HTTP/1.1 500 Internal Server Error", HTML_PAGE, "text/html"), False, 500, ERR, "gw-7.internal"),
    ("html-502-stream", raw_answer("HTTP/1.1 502 Bad Gateway", HTML_PAGE, "text/html"), True, 502, ERR, "gw-7.internal"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("answer", "stream", "status", "code", "logged"),
    [pytest.param(*row[1:], id=row[0]) for row in RAW_ROWS],
)
async def test_an_unexpected_status_or_an_error_page_reaches_the_client_as_an_openai_error(
    fake_oa, fake_ol, log_stream, answer, stream, status, code, logged
):
    """Issue 10 item 9, end to end: a 101 no longer hangs the client, a 205 is no longer a
    200, a redirect or a 999 is no longer relayed verbatim — each is a 502 ``upstream_error``
    whose log line names the status; an upstream's HTML error page keeps its status for the
    client, in an OpenAI envelope that quotes nothing of the page (the log line has it)."""
    async with raw_upstream(answer) as upstream:
        doc = fault_doc(fake_oa.base_url, fake_ol.base_url)
        doc["nodes"][0]["adapters"][0]["base_url"] = upstream.base_url + "/v1"
        daemon = Daemon(parse_config(doc))
        await daemon.start()
        try:
            async with asyncio.timeout(20):  # a hung client fails here, not at the CI's limit
                got_status, got = await ask(daemon.openai_url, "oa", "hello edge", stream)
            stats = await settled(daemon)
        finally:
            await daemon.stop()
    assert (got_status, got["error"]["code"]) == (status, code)
    assert set(got["error"]) == {"message", "type", "param", "code"}
    assert "provider 'oa'" in got["error"]["message"]
    assert "gw-7" not in got["error"]["message"]
    assert "html" not in got["error"]["message"]
    line = next(json.loads(x) for x in log_stream.getvalue().splitlines() if '"request"' in x)
    assert (line["status"], line["code"]) == (status, code)
    assert logged in line["error"]
    assert (stats.admitted, stats.released, stats.double_releases) == (1, 1, 0)
