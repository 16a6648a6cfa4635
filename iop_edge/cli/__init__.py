"""The ``iop-edge`` command line.

Exit codes: 0 success (or, for ``config refresh``, applied / nothing changed), 1 invalid input or
rejected, 2 usage error, 3 restart required.

The package: :mod:`~iop_edge.cli.arguments` (exit codes, the parser class, the arguments several
commands share), :mod:`~iop_edge.cli.admin_client` (the running daemon's admin API),
:mod:`~iop_edge.cli.render` (what the commands print), and a module per command group —
:mod:`~iop_edge.cli.serve`, :mod:`~iop_edge.cli.admin_commands` (``status``, ``restart``),
:mod:`~iop_edge.cli.config_commands`, :mod:`~iop_edge.cli.token_commands` — each adding its
subcommands to the parser built here.
"""

from __future__ import annotations

# Before every other import (they take a few hundred milliseconds), the submodules of this
# package included: importing any of them runs this first. From here on a SIGHUP or SIGUSR2 sent
# to `iop-edge serve` is remembered for the daemon instead of killing the process
# (iop_edge.runtime.signals); outside systemd the process runs, from this import on, as the
# thin parent of the server, and exits with the server's status (iop_edge.runtime.parent).
from iop_edge.runtime import parent, signals  # noqa: F401 (imported for what importing them does)

# isort: split

import argparse
from collections.abc import Sequence

from iop_edge import __version__
from iop_edge.cli.admin_commands import add_admin_commands
from iop_edge.cli.arguments import Parser, default_config_path, subcommands
from iop_edge.cli.config_commands import add_config_commands
from iop_edge.cli.render import format_refresh, format_status
from iop_edge.cli.serve import add_serve_command
from iop_edge.cli.token_commands import add_token_commands

__all__ = ["DESCRIPTION", "build_parser", "format_refresh", "format_status", "main"]

DESCRIPTION = (
    "iop-edge: one OpenAI-compatible endpoint in front of a pool of LLM providers. Exit codes: "
    "0 success (for config refresh: applied, or nothing changed), 1 invalid input or rejected, "
    "2 usage error, 3 restart required."
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand. Help is plain text: no markup, and every
    placeholder says what goes there (FILE, URL, ID, NAME, COMMAND)."""
    parser = Parser(prog="iop-edge", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"iop-edge {__version__}")
    sub = subcommands(parser, "command")
    add_serve_command(sub)
    add_admin_commands(sub)  # status, restart
    add_config_commands(sub)
    add_token_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``iop-edge`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if "file" in args:
        if args.file is not None and args.config is not None and args.file != args.config:
            parser.error(f"two config files given: {args.file} and --config {args.config}")
        args.file = args.file or args.config or default_config_path()
    code: int = args.func(args)
    return code
