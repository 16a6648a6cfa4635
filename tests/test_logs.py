"""Structured logs: the fast request line and structlog agree on the shape."""

from __future__ import annotations

import io
import json

from iop_edge.logs import configure_logging, flush_logs, get_logger


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
