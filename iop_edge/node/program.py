"""``iop-node``: a node agent that dials the edge, receives its ``NodeConfigPayload`` and serves
its providers over one link (design §3, §6).

Nothing else is needed on the node's machine: the edge's URL and the node's token (a file, so
the token never shows in ``ps``, in the environment of child processes, or in a unit file)::

    iop-node --edge https://edge.example:7600 --token-file /etc/iop-node/token --ca-file ca.pem

Each option may come from the environment instead (``$IOP_NODE_EDGE``,
``$IOP_NODE_TOKEN_FILE``); a flag wins over its variable. What the options become is a frozen
:class:`~iop_edge.node.options.NodeOptions`, apart from the live objects of
:mod:`iop_edge.node.agent` that use it.

Exit codes (``deploy/iop-node.service`` restarts on failure but never after a 2):

- 0: stopped by SIGTERM (or SIGINT) after draining;
- 1: any other fatal error — the token file or CA file cannot be read, a payload this node
  cannot run; systemd tries again;
- 2: a usage error (an option missing or malformed, named with its value), or a permanent
  refusal by the edge: the token is not known (HTTP 401), the edge speaks another link protocol
  version, or another agent took over this node's link. Trying again cannot help.

This module never imports :mod:`iop_edge.cli`: importing it makes an ``iop-edge serve`` process
the thin parent of its server (:mod:`iop_edge.runtime.parent`), which a node must not become.
"""

from __future__ import annotations

import argparse
import os
import ssl
import sys
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

from iop_edge import __version__
from iop_edge.node.options import (
    DEFAULT_DRAIN_TIMEOUT,
    EDGE_ENV,
    EDGE_SCHEMES,
    EXIT_FAILED,
    EXIT_USAGE,
    LOG_FORMATS,
    LOG_LEVELS,
    MAX_TOKEN_FILE_BYTES,
    TLS_SCHEMES,
    TOKEN_FILE_ENV,
    NodeOptions,
)

__all__ = ["NodeOptions", "OptionsError", "main", "parse_options", "read_token", "ssl_context"]

DESCRIPTION = (
    "iop-node: a node of iop-edge. It dials the edge's node listener, authenticates with the "
    "node's token, receives its adapters and providers from the edge and serves them. Exit "
    "codes: 0 stopped by SIGTERM after draining, 1 a fatal error (retried by systemd), 2 a "
    "usage error or a permanent refusal (an unknown token, another protocol version)."
)


class OptionsError(Exception):
    """The options cannot run a node; ``exit_code`` says whether that is a usage error (2) or a
    file that cannot be read (1). The message names the option and its value, never the
    token."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class _Parser(argparse.ArgumentParser):
    """Usage errors exit :data:`EXIT_USAGE` with the usage and the error on stderr (argparse's
    own behaviour and code, stated here so that the contract does not hang on a default)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``iop-node`` command line."""
    parser = _Parser(prog="iop-node", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"iop-node {__version__}")
    parser.add_argument(
        "--edge",
        metavar="URL",
        help=f"the edge's node listener, https://HOST:PORT (default: ${EDGE_ENV})",
    )
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        help=f"the file holding this node's token, from iop-edge token node (default: "
        f"${TOKEN_FILE_ENV})",
    )
    parser.add_argument(
        "--ca-file",
        metavar="FILE",
        help="CA certificates (PEM) that verify the edge's certificate instead of the system's",
    )
    parser.add_argument(
        "--drain-timeout",
        metavar="SECONDS",
        default=str(DEFAULT_DRAIN_TIMEOUT),
        help="on SIGTERM, how long requests in flight may take (default 30)",
    )
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="json")
    return parser


def parse_options(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> NodeOptions:
    """The options of ``argv`` over ``environ``'s variables (the process's when None).

    A usage error exits 2 from argparse, or raises :class:`OptionsError` with exit code 2
    (an edge URL or drain timeout that is not one); a token file that cannot be read raises it
    with exit code 1.
    """
    env = os.environ if environ is None else environ
    args = build_parser().parse_args(argv)
    edge = _edge(args.edge, env.get(EDGE_ENV))
    token_source, token_path = _given(
        args.token_file, "--token-file", env.get(TOKEN_FILE_ENV), TOKEN_FILE_ENV
    )
    if not token_path:
        raise OptionsError(
            f"no token file given: pass --token-file FILE or set ${TOKEN_FILE_ENV}", EXIT_USAGE
        )
    drain_timeout = _drain_timeout(args.drain_timeout)
    ca_file = Path(args.ca_file) if args.ca_file else None
    if ca_file is not None and urllib.parse.urlsplit(edge).scheme.lower() not in TLS_SCHEMES:
        raise OptionsError(
            f"--ca-file {ca_file} is for an edge dialled over TLS, but the edge URL {edge!r} "
            "is not https://; use https:// (the edge's listen.tls) or drop --ca-file",
            EXIT_USAGE,
        )
    token = read_token(Path(token_path), token_source)
    return NodeOptions(
        edge=edge,
        token=token,
        token_file=Path(token_path),
        ca_file=ca_file,
        drain_timeout=drain_timeout,
        log_level=args.log_level,
        log_format=args.log_format,
    )


def _given(
    flag: str | None, flag_name: str, variable: str | None, env_name: str
) -> tuple[str, str]:
    """The value given and where it came from (for messages): the flag over the variable;
    ``("", "")`` when neither gives one."""
    if flag:
        return flag_name, flag
    if variable:
        return f"${env_name}", variable
    return "", ""


def _edge(flag: str | None, variable: str | None) -> str:
    source, url = _given(flag, "--edge", variable, EDGE_ENV)
    if not url:
        raise OptionsError(f"no edge given: pass --edge URL or set ${EDGE_ENV}", EXIT_USAGE)
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # (raises ValueError when the port is not a number in range)
    except ValueError as exc:
        raise OptionsError(f"{source} {url!r} is not a URL: {exc}", EXIT_USAGE) from None
    if parts.scheme.lower() not in EDGE_SCHEMES:
        schemes = ", ".join(f"{s}://" for s in EDGE_SCHEMES)
        raise OptionsError(
            f"{source} {url!r}: the edge URL must start with one of {schemes} "
            "(the edge's node listener, listen.address)",
            EXIT_USAGE,
        )
    if not parts.hostname:
        raise OptionsError(
            f"{source} {url!r} names no host; expected https://HOST:PORT", EXIT_USAGE
        )
    if parts.query or parts.fragment or parts.username or parts.password:
        raise OptionsError(
            f"{source} {url!r}: the edge URL takes no user, query or fragment "
            "(the token goes in --token-file)",
            EXIT_USAGE,
        )
    return url


def _drain_timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value < float("inf"):  # (NaN fails both comparisons)
        raise OptionsError(f"--drain-timeout {text!r} is not a number of seconds >= 0", EXIT_USAGE)
    return value


def read_token(path: Path, source: str = "--token-file") -> str:
    """The node token in ``path``: its one line, surrounding whitespace dropped.
    :class:`OptionsError` (exit 1) names the file and what is wrong with it, never its
    content."""
    where = f"the token file {path} ({source})"
    try:
        with path.open("rb") as file:
            data = file.read(MAX_TOKEN_FILE_BYTES + 1)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise OptionsError(f"{where} cannot be read: {reason}", EXIT_FAILED) from None
    if len(data) > MAX_TOKEN_FILE_BYTES:
        raise OptionsError(
            f"{where} is larger than {MAX_TOKEN_FILE_BYTES} bytes; it should hold the one line "
            "iop-edge token node printed",
            EXIT_FAILED,
        )
    try:
        token = data.decode("ascii").strip()
    except UnicodeDecodeError:
        token = None
    if token is None or any(not (0x21 <= ord(c) <= 0x7E) for c in token):
        raise OptionsError(
            f"{where} holds something other than one token (characters outside printable "
            "ASCII, or spaces); it should hold the one line iop-edge token node printed",
            EXIT_FAILED,
        )
    if not token:
        raise OptionsError(
            f"{where} is empty; put the token iop-edge token node printed in it", EXIT_FAILED
        )
    return token


def ssl_context(options: NodeOptions) -> ssl.SSLContext | None:
    """The TLS context that verifies the edge (the system's CAs, or ``--ca-file``'s); ``None``
    for an ``http://`` edge. :class:`OptionsError` (exit 1) when the CA file cannot be used."""
    if not options.tls:
        return None
    try:
        return ssl.create_default_context(
            cafile=str(options.ca_file) if options.ca_file is not None else None
        )
    except (OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise OptionsError(
            f"the CA file {options.ca_file} (--ca-file) cannot be used: {reason}", EXIT_FAILED
        ) from None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``iop-node`` console script; returns the exit code."""
    try:
        options = parse_options(argv)
        context = ssl_context(options)
    except OptionsError as exc:
        print(f"iop-node: {exc}", file=sys.stderr)
        return exc.exit_code
    from iop_edge.runtime.logs import configure_logging, get_logger

    configure_logging(options.log_level, options.log_format)
    import uvloop

    from iop_edge.node.agent import NodeAgent

    agent = NodeAgent(options, log=get_logger("iop_node"), ssl=context)
    return uvloop.run(agent.run())
