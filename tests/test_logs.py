"""Structured logs: the fast request line and structlog agree on the shape; upstream failures
and rejected reloads are warnings; a refresh's line shows each change, secrets redacted; the
console rendering shows a client's control characters escaped, never raw (issue 25 item 4)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from typing import Any

import openai
import pytest

from iop_edge.config import parse_config
from iop_edge.daemon import Daemon
from iop_edge.runtime.logs import (
    FLUSH_BYTES,
    configure_logging,
    escape_controls,
    flush_logs,
    get_logger,
    request_level,
)
from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers import doc_for, dump, edge_on
from tests.helpers.reliability import raw_exchange, raw_request

#: Every control character: C0, DEL and C1 (a terminal acts on ESC, BEL, BS, CR, CSI, ...).
HELLO = [{"role": "user", "content": "hi"}]
CONTROLS = [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0))]


def test_json_request_lines_carry_the_same_keys_as_other_events():
    stream = io.StringIO()
    setup = configure_logging("info", "json", stream)
    log = get_logger()
    log.info("listening", openai="http://127.0.0.1:1")
    setup.request_line_writer(log)({"request_id": "r1", "token_ref": "app", "status": 200})
    flush_logs()
    other, request = (json.loads(line) for line in stream.getvalue().splitlines())
    assert set(other) == {"event", "component", "openai", "level", "timestamp"}
    assert request == {
        "event": "request",
        "component": "iop_edge",
        "request_id": "r1",
        "token_ref": "app",
        "status": 200,
        "level": "info",
        "timestamp": request["timestamp"],
    }
    assert request["timestamp"].endswith("Z")


def test_warning_level_drops_request_lines_and_console_format_renders_them():
    stream = io.StringIO()
    setup = configure_logging("warning", "json", stream)
    setup.request_line_writer(get_logger())({"request_id": "r1"})
    flush_logs()
    assert stream.getvalue() == ""
    setup = configure_logging("info", "console", stream)
    setup.request_line_writer(get_logger())({"request_id": "r2"})
    flush_logs()
    assert "request" in stream.getvalue()
    assert "request_id=r2" in stream.getvalue()


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    flush_logs()
    return [json.loads(line) for line in stream.getvalue().splitlines()]


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_a_request_an_upstream_failed_logs_at_warning(fmt):
    """Issue 15: a request whose answer is an upstream failure, or that failed over from a
    provider, is a warning — kept by a log at level ``warning``, which drops the others."""
    failed = {"request_id": "r1", "code": "upstream_timeout", "failed_over": None}
    retried = {"request_id": "r2", "code": "ok", "failed_over": ["n1/a: connect"]}
    fine = {"request_id": "r3", "code": "ok", "failed_over": None}
    assert [request_level(f) for f in (failed, retried, fine)] == ["warning", "warning", "info"]
    stream = io.StringIO()
    setup = configure_logging("info", fmt, stream)
    write = setup.request_line_writer(get_logger())
    for fields in (failed, retried, fine):
        write(fields)
    if fmt == "json":  # the fast writer
        assert [(x["request_id"], x["level"]) for x in lines(stream)] == [
            ("r1", "warning"),
            ("r2", "warning"),
            ("r3", "info"),
        ]
    stream = io.StringIO()
    setup = configure_logging("warning", fmt, stream)
    write = setup.request_line_writer(get_logger())
    for fields in (failed, retried, fine):
        write(fields)
    flush_logs()
    text = stream.getvalue()
    assert ("r1" in text, "r2" in text, "r3" in text) == (True, True, False)


@pytest.mark.parametrize(
    ("status", "raised", "level", "code"),
    [
        (500, openai.InternalServerError, "warning", "upstream_error"),
        (429, openai.RateLimitError, "warning", "upstream_error"),
        # the upstream refused the request: no failure (issue 25: its own code)
        (400, openai.BadRequestError, "info", "client_error"),
    ],
)
async def test_an_upstream_error_answer_is_logged_at_warning_unless_it_refused_the_request(
    tmp_path, log_stream, status, raised, level, code
):
    async with (
        FakeOpenAI(behavior=FakeBehavior(status=status)) as fake,
        edge_on(tmp_path, doc_for(fake)) as edge,
        openai.AsyncOpenAI(base_url=edge.daemon.openai_url, api_key="x", max_retries=0) as client,
    ):
        with pytest.raises(raised):
            await client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "x"}]
            )
    [line] = [x for x in lines(log_stream) if x["event"] == "request"]
    assert (line["level"], line["code"], line["status"]) == (level, code, status)


async def test_a_refresh_logs_each_change_old_to_new_secrets_redacted(tmp_path, log_stream):
    """The ``config_refresh`` line lists every changed path with its old and new value,
    redacted as the refresh result is (a header's value never reaches the log); a rejected
    reload is a warning."""
    async with FakeOpenAI() as fake:
        doc = doc_for(fake)
        provider = doc["nodes"][0]["providers"][1]
        provider["headers"] = {"Authorization": "Bearer sk-old-secret-value"}
        async with edge_on(tmp_path, doc) as edge:
            provider["capacity"] = 5
            provider["headers"] = {"Authorization": "Bearer sk-new-secret-value"}
            edge.path.write_text(dump(doc))
            assert (await edge.supervisor.refresh("api")).result == "restart_required"
            doc["provider_pool"]["max_queue"] = -1
            edge.path.write_text(dump(doc))
            assert (await edge.supervisor.refresh("api")).result == "rejected"
    changed, rejected = [x for x in lines(log_stream) if x["event"] == "config_refresh"]
    assert changed["level"] == "info"
    assert changed["changes"] == [
        {
            "path": "nodes[local].providers[up].capacity",
            "class": "live",
            "old": 2,
            "new": 5,
            "applied": True,
        },
        {
            "path": "nodes[local].providers[up].headers.Authorization",
            "class": "restart",
            "old": "<redacted>",
            "new": "<redacted>",
            "applied": False,
        },
        {
            "path": "nodes[local].providers[up].long_context_capacity",
            "class": "live",
            "old": 2,
            "new": 5,
            "applied": True,
        },
    ]
    assert "secret-value" not in log_stream.getvalue()
    assert rejected["level"] == "warning"
    assert rejected["errors"] == ["provider_pool.max_queue: -1 is negative; max_queue must be >= 0"]


class CountingStream(io.StringIO):
    """A log stream that counts its writes (each one a system call on a real file)."""

    writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


async def test_lines_logged_together_are_written_in_one_write_and_a_big_batch_at_once():
    stream = CountingStream()
    configure_logging("info", "json", stream)
    log = get_logger()
    for n in range(3):
        log.info("tick", n=n)
    assert stream.writes == 0  # queued: nothing written before the loop turns
    flush_logs()
    assert stream.writes == 1
    assert [json.loads(line)["n"] for line in stream.getvalue().splitlines()] == [0, 1, 2]
    log.info("big", text="x" * FLUSH_BYTES)  # past the batch's size: written at once
    assert stream.writes == 2


def test_lines_queued_when_the_process_exits_are_written():
    """A line logged in a loop that ends (an error, an exit) before the batch is due still
    reaches the log: the writer is flushed at exit."""
    script = (
        "import asyncio, sys\n"
        "from iop_edge.runtime.logs import configure_logging, get_logger\n"
        "configure_logging('info', 'json', sys.stdout)\n"
        "async def main():\n"
        "    get_logger().warning('last_words')\n"
        "    raise SystemExit(3)\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 3
    assert json.loads(done.stdout)["event"] == "last_words"


# --- issue 25 item 4: control characters never reach the console raw --------------------------


def raw_controls(text: str) -> set[str]:
    """The control characters in ``text`` other than the line feeds that end its lines."""
    return {c for c in text if c in CONTROLS and c != "\n"}


@pytest.mark.parametrize("char", CONTROLS, ids=lambda c: f"0x{ord(c):02x}")
def test_the_console_rendering_escapes_each_control_character(char):
    """Each control character in a text value, the event included, is written as its
    ``\\xNN`` escape; a traceback keeps its line feeds and tabs, and escapes the rest."""
    escaped = f"\\x{ord(char):02x}"
    fields = escape_controls(None, "info", {"event": f"e{char}", "path": f"/a{char}b", "n": 1})
    assert fields == {"event": f"e{escaped}", "path": f"/a{escaped}b", "n": 1}
    kept = char if char in "\t\n" else escaped
    trace = escape_controls(None, "error", {"event": "boom", "exception": f"x{char}y"})
    assert trace["exception"] == f"x{kept}y"

    stream = io.StringIO()
    configure_logging("info", "console", stream)
    log = get_logger()
    log.info("unknown_route", path=f"/a{char}b", method=f"G{char}T", nested={"k": f"v{char}"})
    try:
        raise ValueError(f"bad {char} value")
    except ValueError:
        log.exception(f"failed{char}")
    flush_logs()
    text = stream.getvalue()
    assert raw_controls(text) <= {"\t"}  # a tab only where the traceback keeps one
    assert f"path=/a{escaped}b" in text
    assert f"method=G{escaped}T" in text
    assert f"failed{escaped}" in text
    assert f"ValueError: bad {kept} value" in text


async def test_a_requests_control_bytes_reach_the_console_log_escaped():
    """Issue 25 item 4: with ``logging.format: console``, an unauthenticated client's path
    (percent-encoded: the HTTP parser refuses raw control bytes in a request line or a header)
    and model name holding ESC, BEL, BS, NUL, DEL and the C1 CSI reach the log escaped; before,
    the request line wrote them raw, and an operator's terminal acted on them."""
    stream = io.StringIO()
    configure_logging("info", "console", stream)
    daemon = Daemon(parse_config(doc_for()))
    await daemon.start()
    try:
        listener = daemon.listeners["openai"]
        path = "/%1b[2J%1b]0;pwned%07%08%00%7f%c2%9b31m"
        status, _ = await raw_exchange(listener.host, listener.port, raw_request("GET", path))
        assert status == 404
        body = json.dumps({"model": "\x1b[31mred\x07\x08\x00", "messages": HELLO}).encode()
        request = raw_request(
            "POST", "/v1/chat/completions", [(b"Content-Type", b"application/json")], body
        )
        status, _ = await raw_exchange(listener.host, listener.port, request)
        assert status == 404  # model_not_found
    finally:
        await daemon.stop()
    flush_logs()
    text = stream.getvalue()
    lines = [line for line in text.splitlines() if "[info     ] request " in line]
    assert len(lines) == 2
    assert raw_controls(text) == set()
    assert "path=/\\x1b[2J\\x1b]0;pwned\\x07\\x08\\x00\\x7f\\x9b31m" in lines[0]
    assert "\\x1b[31mred\\x07\\x08\\x00" in lines[1]
