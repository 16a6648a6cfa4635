"""Structured logs: one JSON object per event (or a console rendering), never a raw token.

Events carry request ids, ``principal_ref`` and ``token_ref`` — the raw bearer token and the
provider credential never reach a log line: the request path logs only the fields of
:meth:`iop_edge.api.record.RequestRecord.log_fields`.

An event logged with ``exc_info`` (``log.exception(...)``) carries its traceback: the JSON line
in an ``exception`` field, the console rendering below the line. What libraries write through
the stdlib :mod:`logging` module (asyncio's "socket.accept() out of system resource", aiohttp's
"Error handling request") is routed into the same structured log at warning level and above,
at most one line per message every :data:`LIBRARY_LOG_INTERVAL` seconds (:class:`StdlibBridge`).

The console rendering writes text values as they are, so :func:`escape_controls` first turns
every control character in them (C0, DEL, C1) into a ``\\x1b``-style escape: a request path or
a header a client chose cannot move the cursor, recolour or erase an operator's terminal, or
forge a line. The JSON rendering escapes them itself (``\\u001b``).
"""

from __future__ import annotations

import asyncio
import atexit
import errno
import logging
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final, TextIO

import orjson
import structlog

LIBRARY_LOG_INTERVAL: Final = 10.0
"""Seconds between two log lines of one repeated library message (the others are counted)."""

_LEVELS: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


#: Every control character (C0, DEL, C1) and its escape as Python writes it (``\\x1b``).
_CONTROL_ESCAPES: Final = {code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))}
#: The same, except line feed and tab, for a traceback's text (it spans lines).
_TRACEBACK_ESCAPES: Final = {
    code: escape for code, escape in _CONTROL_ESCAPES.items() if code not in (0x09, 0x0A)
}


def escape_controls(
    logger: Any, method: str, event_dict: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    """A structlog processor for the console rendering: every control character in a text
    value (the event, a path, a method, a header-derived field) becomes a ``\\x1b``-style
    escape, so a client's bytes reach the terminal as text. A traceback (``exception``) keeps
    its line feeds and tabs. Containers need nothing: the renderer shows them with ``repr``,
    which escapes their strings already."""
    for key, value in event_dict.items():
        # isprintable() is False for every control character (and a few harmless others):
        # the usual value costs that one scan.
        if isinstance(value, str) and not value.isprintable():
            table = _TRACEBACK_ESCAPES if key == "exception" else _CONTROL_ESCAPES
            event_dict[key] = value.translate(table)
    return event_dict


def _orjson_dumps(event: Any, **_: Any) -> str:
    return orjson.dumps(event, default=str).decode()


class LineWriter:
    """A structlog logger that writes rendered lines to ``stream`` in batches: lines queued
    within :data:`FLUSH_INTERVAL` seconds of the first go out in one write and flush, or at once
    when :data:`FLUSH_BYTES` are queued; outside a running loop, at once. A write is a system
    call, and one per turn of the loop (often one per request) was a tenth of a request's CPU
    (``bench/profile_edge.py``). So a line reaches the log up to 20 ms late; ``flush_logs``
    writes what is queued (the daemon calls it as it stops), and a killed process loses at most
    the last 20 ms of lines.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._pending: list[str] = []
        self._size = 0
        self._timer: asyncio.TimerHandle | None = None

    def msg(self, message: str) -> None:
        """Queue one rendered line."""
        self._pending.append(message)
        self._size += len(message)
        if self._size >= FLUSH_BYTES:
            self.flush()
        elif self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self.flush()
                return
            self._timer = loop.call_later(FLUSH_INTERVAL, self.flush)

    debug = info = warning = warn = error = critical = exception = fatal = msg

    def flush(self) -> None:
        """Write and flush every queued line."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._pending:
            lines, self._pending, self._size = self._pending, [], 0
            self._stream.write("\n".join(lines) + "\n")
            self._stream.flush()


#: Seconds a log line may wait to be written with the lines after it.
FLUSH_INTERVAL: Final = 0.02
#: Queued characters that are written at once.
FLUSH_BYTES: Final = 256 * 1024


#: A structlog logger as :func:`get_logger` returns it.
Logger = structlog.typing.FilteringBoundLogger
#: Writes one request's log line from its fields (:meth:`LogSetup.request_line_writer`).
RequestLineWriter = Callable[[dict[str, Any]], None]


class LogSetup:
    """What :func:`configure_logging` set up: hand :meth:`request_line_writer` to the request
    path (the daemon injects it; nothing reads module state per request)."""

    def __init__(self, writer: LineWriter, fast_json: bool) -> None:
        self.writer = writer
        self.fast_json = fast_json

    def request_line_writer(self, log: Logger) -> RequestLineWriter:
        """The writer of per-request log lines (at ``warning`` for an upstream failure, see
        :func:`request_level`, else ``info``). With JSON logs at info level or below it
        renders the line straight to the writer (the same fields structlog would write, without
        its processor chain: that chain was a tenth of a request's CPU); otherwise it goes
        through ``log``."""
        if not self.fast_json:
            return structured_request_line(log)
        writer = self.writer

        def write(fields: dict[str, Any]) -> None:
            now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
            writer.msg(
                _orjson_dumps(
                    {
                        "event": "request",
                        "component": "iop_edge",
                        **fields,
                        "level": request_level(fields),
                        "timestamp": now,
                    }
                )
            )

        return write


#: The request codes of an upstream that failed (the request's log line is a warning).
UPSTREAM_FAILURE_CODES: Final = frozenset({"upstream_error", "upstream_timeout"})


def request_level(fields: dict[str, Any]) -> str:
    """``warning`` for the line of a request an upstream failed (its answer's ``code`` says so,
    or an attempt failed over to another provider: ``failed_over``), else ``info``. An upstream
    that answered a 4xx other than 429 refused the request, not failed it: ``info``."""
    if fields.get("failed_over"):
        return "warning"
    if fields.get("code") in UPSTREAM_FAILURE_CODES:
        status = fields.get("status", 0)
        return "info" if 400 <= status < 500 and status != 429 else "warning"
    return "info"


def structured_request_line(log: Logger) -> RequestLineWriter:
    """Request lines through ``log``'s processor chain (any format, any level): at ``warning``
    for an upstream failure (:func:`request_level`), so a log at level ``warning`` keeps them."""

    def write(fields: dict[str, Any]) -> None:
        if request_level(fields) == "warning":
            log.warning("request", **fields)
        else:
            log.info("request", **fields)

    return write


def configure_logging(
    level: str = "info", fmt: str = "json", stream: TextIO | None = None
) -> LogSetup:
    """Configure structlog for the process: JSON lines (or console) on ``stream`` (stderr), and
    route the stdlib ``logging`` records of libraries into it (:class:`StdlibBridge`)."""
    global _writer
    if _writer is None:  # (once: lines queued when the process exits are written then)
        atexit.register(flush_logs)
    else:
        _writer.flush()
    writer = _writer = LineWriter(stream or sys.stderr)
    renderers: list[structlog.typing.Processor]
    if fmt == "console":
        # The console renderer prints an event's traceback below the line; it is made text
        # first (format_exc_info) so that escape_controls sees it: an exception's message
        # may quote a client's bytes too.
        renderers = [
            structlog.processors.format_exc_info,
            escape_controls,
            structlog.dev.ConsoleRenderer(
                colors=False, exception_formatter=structlog.dev.plain_traceback
            ),
        ]
    else:
        # exc_info=True (log.exception) becomes the traceback text in "exception": without
        # this processor the JSON line said only "exc_info": true.
        renderers = [
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(serializer=_orjson_dumps),
        ]
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            *renderers,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=lambda *args: writer,
        cache_logger_on_first_use=True,
    )
    StdlibBridge.install(get_logger("library"), max(_LEVELS[level], logging.WARNING))
    return LogSetup(writer, fast_json=fmt == "json" and _LEVELS[level] <= logging.INFO)


#: The process's line writer (structlog's configuration is process-wide): for flush_logs only.
_writer: LineWriter | None = None


def flush_logs() -> None:
    """Write out every queued log line now (before the process exits)."""
    if _writer is not None:
        _writer.flush()


def get_logger(name: str = "iop_edge") -> Logger:
    """A structlog logger bound to the component ``name``."""
    logger: Logger = structlog.get_logger(component=name)
    return logger


class RateLimiter:
    """Lets an event through at most once every ``interval`` seconds per key and counts the
    ones it holds back: :meth:`allow` returns how many occurrences (this one included) the
    line to write stands for, or 0 when the line is to be skipped."""

    def __init__(
        self, interval: float = LIBRARY_LOG_INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval = interval
        self._clock = clock
        self._last: dict[object, float] = {}
        self._held: dict[object, int] = {}

    def allow(self, key: object) -> int:
        """0 to skip this occurrence, else the count of occurrences the line reports."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._held[key] = self._held.get(key, 0) + 1
            return 0
        self._last[key] = now
        return self._held.pop(key, 0) + 1


_FD_ERRNOS: Final = (errno.EMFILE, errno.ENFILE)


class StdlibBridge(logging.Handler):
    """Writes the records of the stdlib ``logging`` module (asyncio, aiohttp, ...) to the
    structured log: ``event`` is the message, ``logger`` the library's logger, ``exception``
    the traceback, ``count`` how many times it happened since its last line (rate-limited per
    logger and message). Running out of file descriptors (EMFILE/ENFILE, e.g. on accept) is
    logged as the event ``fd_limit_reached``."""

    def __init__(self, log: Any, level: int) -> None:
        super().__init__(level)
        self._log = log
        self._limiter = RateLimiter()

    @classmethod
    def install(cls, log: Any, level: int) -> StdlibBridge:
        """Make a bridge the root logger's only handler of this kind (replacing an earlier
        one); records below ``level`` are dropped where they are made."""
        root = logging.getLogger()
        for handler in list(root.handlers):
            if isinstance(handler, cls):
                root.removeHandler(handler)
        bridge = cls(log, level)
        root.addHandler(bridge)
        root.setLevel(level)
        return bridge

    def emit(self, record: logging.LogRecord) -> None:
        """Write ``record`` as one structured event, unless it is rate-limited."""
        try:
            exc = record.exc_info[1] if record.exc_info else None
            fd_limit = isinstance(exc, OSError) and exc.errno in _FD_ERRNOS
            count = self._limiter.allow((record.name, record.msg, fd_limit))
            if not count:
                return
            fields: dict[str, Any] = {"logger": record.name, "count": count}
            if record.exc_info:
                fields["exc_info"] = record.exc_info
            message = record.getMessage()
            method = getattr(self._log, record.levelname.lower(), self._log.error)
            if fd_limit:
                fields["message"] = message
                method("fd_limit_reached", **fields)
            else:
                method(message, **fields)
        except Exception:  # a log handler must never raise into the code that logged
            self.handleError(record)
