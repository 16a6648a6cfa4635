"""Structured logs: one JSON object per event (or a console rendering), never a raw token.

Events carry request ids, ``principal_ref`` and ``token_ref`` — the raw bearer token and the
provider credential never reach a log line: the request path logs only the fields named in
:data:`REQUEST_FIELDS`.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final, TextIO

import orjson
import structlog

REQUEST_FIELDS: Final = (
    "request_id",
    "principal_ref",
    "token_ref",
    "model",
    "provider",
    "node",
    "status",
    "code",
    "stream",
    "queue_wait_ms",
    "duration_ms",
    "prompt_tokens",
    "completion_tokens",
)

_LEVELS: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def _orjson_dumps(event: Any, **_: Any) -> str:
    return orjson.dumps(event, default=str).decode()


class LineWriter:
    """A structlog logger that writes rendered lines to ``stream`` and flushes once per turn of
    the event loop: one write and flush for a burst of request lines, not one per line (a
    flush per line was several percent of a request's CPU). Outside a loop it flushes at once.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._pending: list[str] = []
        self._scheduled = False

    def msg(self, message: str) -> None:
        """Queue one rendered line."""
        self._pending.append(message)
        if self._scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        self._scheduled = True
        loop.call_soon(self.flush)

    debug = info = warning = warn = error = critical = exception = fatal = msg

    def flush(self) -> None:
        """Write and flush every queued line."""
        self._scheduled = False
        if self._pending:
            lines, self._pending = self._pending, []
            self._stream.write("\n".join(lines) + "\n")
            self._stream.flush()


def configure_logging(level: str = "info", fmt: str = "json", stream: TextIO | None = None) -> None:
    """Configure structlog for the process: JSON lines (or console) on ``stream`` (stderr)."""
    global _writer, _fast_json
    writer = _writer = LineWriter(stream or sys.stderr)
    _fast_json = fmt == "json" and _LEVELS[level] <= logging.INFO
    renderer: structlog.typing.Processor
    if fmt == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    else:
        renderer = structlog.processors.JSONRenderer(serializer=_orjson_dumps)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=lambda *args: writer,
        cache_logger_on_first_use=True,
    )


_writer: LineWriter | None = None
_fast_json = False


def request_logger(log: Any) -> Callable[[dict[str, Any]], None]:
    """The writer of per-request log lines. With JSON logs at info level or below it renders
    the line straight to the writer (the same fields structlog would write, without its
    processor chain: that chain was a tenth of a request's CPU); otherwise it goes through
    ``log``."""
    writer = _writer
    if _fast_json and writer is not None:

        def write(fields: dict[str, Any]) -> None:
            now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
            writer.msg(
                _orjson_dumps(
                    {
                        "event": "request",
                        "component": "iop_edge",
                        **fields,
                        "level": "info",
                        "timestamp": now,
                    }
                )
            )

        return write
    return lambda fields: log.info("request", **fields)


def flush_logs() -> None:
    """Write out every queued log line now (before the process exits)."""
    if _writer is not None:
        _writer.flush()


def get_logger(name: str = "iop_edge") -> Any:
    """A structlog logger bound to the component ``name``."""
    return structlog.get_logger(component=name)
