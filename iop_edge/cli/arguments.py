"""What every command of the ``iop-edge`` command line shares: the exit codes, the default
config file, the parser class (plain help text, usage errors exit 2), and the arguments several
commands take alike (the config file, the way to the running daemon's admin API, ``--json``)."""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from typing import Any, NoReturn

from iop_edge.api.auth import ADMIN_TOKEN_ENV

# The exit codes of every command, in one table (docs/cli.md).
EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2
EXIT_RESTART = 3

DEFAULT_CONFIG = "/etc/iop-edge/edge.yaml"


def default_config_path() -> str:
    """``$IOP_EDGE_CONFIG`` when set, else the packaged location ``/etc/iop-edge/edge.yaml``."""
    return os.environ.get("IOP_EDGE_CONFIG", DEFAULT_CONFIG)


class HelpFormatter(argparse.HelpFormatter):
    """Help text wrapped at spaces only (a path like /etc/iop-edge/edge.yaml stays whole)."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class Parser(argparse.ArgumentParser):
    """The parser of ``iop-edge`` and of each of its subcommands: help wrapped by
    :class:`HelpFormatter`, and a usage error exits with :data:`EXIT_USAGE`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """Print the usage and the error on stderr, and exit with :data:`EXIT_USAGE`."""
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


ADMIN_TOKEN_HELP = f"read the admin token from FILE (default: ${ADMIN_TOKEN_ENV})"
CONFIG_HELP = f"the config file (default: $IOP_EDGE_CONFIG, else {DEFAULT_CONFIG})"
JSON_HELP = "print JSON instead of text"


def config_file_arguments(parser: argparse.ArgumentParser) -> None:
    """``[FILE]`` and ``--config FILE``: the same file (the positional form is kept as an
    alias); :func:`iop_edge.cli.main` puts the one given in ``args.file``."""
    parser.add_argument(
        "file", nargs="?", default=None, metavar="FILE", help="the config file (as --config)"
    )
    parser.add_argument("--config", metavar="FILE", help=CONFIG_HELP)


def console_arguments(parser: argparse.ArgumentParser, config_help: str) -> None:
    """How a command finds and reaches the running daemon's admin API."""
    parser.add_argument("--config", metavar="FILE", default=default_config_path(), help=config_help)
    parser.add_argument("--console", metavar="URL", help="the admin API's base URL")
    parser.add_argument("--admin-token-file", metavar="FILE", help=ADMIN_TOKEN_HELP)


def subcommands(parser: argparse.ArgumentParser, dest: str) -> Any:
    """The subcommands of ``parser``, one required, named in ``args.<dest>``."""
    return parser.add_subparsers(
        dest=dest, required=True, parser_class=Parser, metavar="COMMAND", title="commands"
    )
