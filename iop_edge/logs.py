"""Structured logs: one JSON object per event (or a console rendering), never a raw token.

Events carry request ids, ``principal_ref`` and ``token_ref`` — the raw bearer token and the
provider credential never reach a log line: the request path logs only the fields named in
:data:`REQUEST_FIELDS`.
"""

from __future__ import annotations

import logging
import sys
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


def configure_logging(level: str = "info", fmt: str = "json", stream: TextIO | None = None) -> None:
    """Configure structlog for the process: JSON lines (or console) on ``stream`` (stderr)."""
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
        logger_factory=structlog.PrintLoggerFactory(stream or sys.stderr),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str = "iop_edge") -> Any:
    """A structlog logger bound to the component ``name``."""
    return structlog.get_logger(component=name)
