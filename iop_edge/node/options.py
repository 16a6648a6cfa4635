"""What ``iop-node`` is asked to do (:class:`NodeOptions`), apart from the live objects that do
it (:mod:`iop_edge.node.agent`), and the exit codes of the program.

As :mod:`iop_edge.options` is for ``iop-edge serve``: a frozen value built once from the command
line (:func:`iop_edge.node.program.parse_options`) or by a test, read by the agent; nothing
changes it while the process runs.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

__all__ = [
    "DEFAULT_DRAIN_TIMEOUT",
    "EDGE_ENV",
    "EXIT_DRAINED",
    "EXIT_FAILED",
    "EXIT_REFUSED",
    "EXIT_USAGE",
    "TOKEN_FILE_ENV",
    "NodeOptions",
]

EXIT_DRAINED: Final = 0
"""SIGTERM or SIGINT, and the requests in flight finished (or the drain timed out)."""
EXIT_FAILED: Final = 1
"""Any other fatal error: systemd restarts the node (``Restart=on-failure``)."""
EXIT_REFUSED: Final = 2
"""Permanent: a refused token, a protocol version the edge does not speak, superseded by another
agent (``RestartPreventExitStatus=2``)."""
EXIT_USAGE: Final = 2
"""A usage error: permanent too, like argparse's own."""

EDGE_ENV: Final = "IOP_NODE_EDGE"
TOKEN_FILE_ENV: Final = "IOP_NODE_TOKEN_FILE"
DEFAULT_DRAIN_TIMEOUT: Final = 30.0
"""Seconds a SIGTERM lets the requests in flight run before they are cancelled."""

EDGE_SCHEMES: Final = ("https", "http", "wss", "ws")
"""What ``--edge`` may start with: the node listener's URL (``https`` when it has
``listen.tls``); the WebSocket schemes are accepted as the same thing."""
TLS_SCHEMES: Final = frozenset({"https", "wss"})
MAX_TOKEN_FILE_BYTES: Final = 4096
"""A node token is one short line; a bigger file is not a token file."""
LOG_LEVELS: Final = ("debug", "info", "warning", "error")
LOG_FORMATS: Final = ("json", "console")


@dataclass(frozen=True, slots=True)
class NodeOptions:
    """How one ``iop-node`` process runs, built once by :func:`parse_options`.

    ``token`` is the node's secret: it is left out of ``repr`` (and so out of any log line or
    traceback that shows the options), and only ever sent in the ``Authorization`` header of the
    link's upgrade request.
    """

    #: the edge's node listener (``--edge``), as given
    edge: str
    #: the node token read from ``--token-file``
    token: str = field(repr=False)
    #: the token file, for messages (never its content)
    token_file: Path | None = None
    #: a CA bundle that verifies the edge's certificate instead of the system's (``--ca-file``)
    ca_file: Path | None = None
    #: seconds a SIGTERM lets requests in flight finish
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT
    log_level: str = "info"
    log_format: str = "json"

    @property
    def link_url(self) -> str:
        """The WebSocket the node dials: ``GET /link`` under ``edge``."""
        return self.edge.rstrip("/") + "/link"

    @property
    def tls(self) -> bool:
        """Whether the edge is dialled over TLS."""
        return urllib.parse.urlsplit(self.edge).scheme.lower() in TLS_SCHEMES
