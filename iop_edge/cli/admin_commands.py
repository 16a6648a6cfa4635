"""``iop-edge status`` and ``iop-edge restart``: the commands that ask the running daemon,
through its admin API, for its status or for a handover to a new process."""

from __future__ import annotations

import argparse
import json
from typing import Any

from iop_edge.cli.admin_client import call_console
from iop_edge.cli.arguments import EXIT_INVALID, EXIT_OK, JSON_HELP, console_arguments
from iop_edge.cli.render import format_status, restart_lines


def cmd_status(args: argparse.Namespace) -> int:
    """``iop-edge status [--json]``: the running daemon's status, from its admin API."""
    status = call_console("status", args, "/admin/status", "GET")
    if status is None:
        return EXIT_INVALID
    print(json.dumps(status, indent=2) if args.json else format_status(status))
    return EXIT_OK


def cmd_restart(args: argparse.Namespace) -> int:
    """``iop-edge restart``: hand the running daemon over to a new process (admin API)."""
    result = call_console("restart", args, "/admin/restart", "POST")
    if result is None:
        return EXIT_INVALID
    print(json.dumps(result, indent=2) if args.json else "\n".join(restart_lines(result)))
    return EXIT_OK if result["result"] == "handed_over" else EXIT_INVALID


def add_admin_commands(sub: Any) -> None:
    """``iop-edge status`` and ``iop-edge restart``, added to the subcommands ``sub``."""
    status = sub.add_parser(
        "status",
        help="the running daemon's status (admin API)",
        description="Print the running daemon's status, from its admin API.",
    )
    console_arguments(status, "the daemon's config file (to find its admin API)")
    status.add_argument("--json", action="store_true", help=JSON_HELP)
    status.set_defaults(func=cmd_status)

    restart = sub.add_parser(
        "restart",
        help="hand the running daemon over to a new process, without a gap",
        description="Hand the running daemon over to a new process running the same command "
        "line, without a gap (the new process reads the config, --env-file and ${file:} "
        "files again).",
    )
    console_arguments(restart, "the daemon's config file (to find its admin API)")
    restart.add_argument("--json", action="store_true", help=JSON_HELP)
    restart.set_defaults(func=cmd_restart)
