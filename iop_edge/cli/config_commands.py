"""``iop-edge config validate|show|payload|refresh``: a config file read as the daemon reads
it, checked, shown with its secrets redacted, mapped to a node's payload, or classified against
the running config (through the running daemon's admin API, or ``--offline`` against a file)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from typing import Any, Final

from iop_edge.cli.admin_client import call_console
from iop_edge.cli.arguments import (
    CONFIG_HELP,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_RESTART,
    EXIT_USAGE,
    JSON_HELP,
    config_file_arguments,
    console_arguments,
    default_config_path,
    subcommands,
)
from iop_edge.cli.render import config_text, format_refresh, print_problems
from iop_edge.config import ConfigError, EdgeConfig, dump_config
from iop_edge.config.payload import node_payload
from iop_edge.config.redact import redact
from iop_edge.config.refresh import Outcome, RefreshResult, refresh
from iop_edge.config.validate import config_warnings
from iop_edge.config_file import load_config_file, read_config_text, read_secret_file

#: What ``config refresh`` exits with for each refresh result.
REFRESH_EXIT: Final[dict[Outcome, int]] = {
    "applied": EXIT_OK,
    "rejected": EXIT_INVALID,
    "restart_required": EXIT_RESTART,
}


def read_config(path: str, env: Mapping[str, str] | None = None) -> EdgeConfig:
    """Read and load a config file as the daemon does (:mod:`iop_edge.config_file`): an
    unreadable, non-regular, oversized or non-UTF-8 file becomes a one-line ConfigError.
    References resolve from ``env`` (default: this process's environment) and files."""
    return load_config_file(path, os.environ if env is None else env)


def cmd_config_validate(args: argparse.Namespace) -> int:
    """``iop-edge config validate [FILE] [--json]``."""
    try:
        config = read_config(args.file)
    except ConfigError as exc:
        print_problems(exc, args.json)
        return EXIT_INVALID
    warnings = config_warnings(config)
    if args.json:
        listed = [{"path": p.path, "message": p.message} for p in warnings]
        print(json.dumps({"valid": True, "errors": [], "warnings": listed}, indent=2))
    else:
        print(f"{args.file}: valid")
        for problem in warnings:
            print(f"warning: {problem}")
    return EXIT_OK


def cmd_config_show(args: argparse.Namespace) -> int:
    """``iop-edge config show [FILE] [--json]``: the effective config, secrets redacted."""
    try:
        config = read_config(args.file)
    except ConfigError as exc:
        print_problems(exc, False)
        return EXIT_INVALID
    print(config_text(redact(dump_config(config)), args.json), end="")
    return EXIT_OK


def cmd_config_payload(args: argparse.Namespace) -> int:
    """``iop-edge config payload --node ID [--config FILE] [--show-secrets]``: one node's
    payload as JSON, its secrets redacted as ``config show`` redacts them, and every value the
    config took from the environment or a file too, unless ``--show-secrets``."""
    try:
        config = read_config(args.config)
        payload = node_payload(config, args.node)
    except ConfigError as exc:
        print_problems(exc, False)
        return EXIT_INVALID
    data = payload.model_dump(mode="json", exclude_none=True)
    if not args.show_secrets:
        data = redact(config.provenance.scrub(data))
    print(json.dumps(data, indent=2, ensure_ascii=False))
    return EXIT_OK


def cmd_config_refresh(args: argparse.Namespace) -> int:
    """``iop-edge config refresh [--dry-run|--apply] [--candidate FILE] [--config FILE]``.

    Online, the running daemon (of ``--config``) reads its own config file and answers
    (``--apply`` applies the live part); with ``--candidate FILE`` it judges that file's text
    instead, as a dry run, and its own file is not touched. With ``--offline RUNNING.yaml``
    nothing runs: the result says what a daemon running RUNNING.yaml would do with the
    candidate (``--candidate``, else ``--config``).
    """
    if args.candidate and args.apply:
        print(
            "iop-edge config refresh: --candidate is judged as a dry run only; to apply it, "
            "write it to the daemon's config file and run iop-edge config refresh --apply",
            file=sys.stderr,
        )
        return EXIT_USAGE
    mode = "apply" if args.apply else "dry_run"
    if not args.offline:
        body = None
        if args.candidate:
            try:
                body = {"candidate": read_config_text(args.candidate), "source": args.candidate}
            except ConfigError as exc:
                print_problems(exc, False)
                return EXIT_INVALID
        data = call_console(
            "config refresh",
            args,
            f"/admin/config/refresh?mode={mode}",
            "POST",
            body,
            hint=" (use --offline RUNNING.yaml to compare files without a daemon)",
        )
        if data is None:
            return EXIT_INVALID
        online = RefreshResult.model_validate(data)
        print(json.dumps(online.to_json(), indent=2) if args.json else format_refresh(online))
        return REFRESH_EXIT[online.result]
    try:
        running = read_config(args.offline)
    except ConfigError as exc:
        print(f"the running config {args.offline} does not load:", file=sys.stderr)
        print_problems(exc, False)
        return EXIT_INVALID
    source = args.candidate or args.config
    try:
        text = read_config_text(source)
    except ConfigError as exc:
        print_problems(exc, False)
        return EXIT_INVALID
    result = refresh(
        running, text, mode=mode, env=os.environ, read_file=read_secret_file, source=source
    ).result
    print(json.dumps(result.to_json(), indent=2) if args.json else format_refresh(result))
    return REFRESH_EXIT[result.result]


def add_config_commands(sub: Any) -> None:
    """``iop-edge config`` and its subcommands, added to the subcommands ``sub``."""
    config = sub.add_parser(
        "config",
        help="validate, show and compare configs",
        description="Validate, show and compare configs.",
    )
    config_sub = subcommands(config, "config_command")

    validate = config_sub.add_parser(
        "validate",
        help="check a config; exit 1 listing every problem",
        description="Check a config; exit 1 listing every problem.",
    )
    config_file_arguments(validate)
    validate.add_argument("--json", action="store_true", help='print {"valid", "errors"}')
    validate.set_defaults(func=cmd_config_validate)

    show = config_sub.add_parser(
        "show",
        help="print the effective config (secrets redacted)",
        description="Print the effective config, secrets redacted.",
    )
    config_file_arguments(show)
    show.add_argument("--json", action="store_true", help=JSON_HELP)
    show.set_defaults(func=cmd_config_show)

    payload = config_sub.add_parser(
        "payload",
        help="print one node's NodeConfigPayload as JSON (secrets redacted)",
        description="Print one node's NodeConfigPayload as JSON, secrets redacted as by config "
        "show, and every value taken from the environment or a file too.",
    )
    payload.add_argument("--node", metavar="ID", required=True, help="the node's id")
    payload.add_argument(
        "--config", metavar="FILE", default=default_config_path(), help=CONFIG_HELP
    )
    payload.add_argument(
        "--show-secrets",
        action="store_true",
        help="print secrets in clear (header and env values, URL passwords, secret-looking "
        "arguments, values from the environment or files)",
    )
    payload.set_defaults(func=cmd_config_payload)

    refresh_cmd = config_sub.add_parser(
        "refresh",
        help="classify a candidate config against the running one",
        description="Classify a candidate config against the running one: the daemon's own "
        "file (--apply applies its live part), another file (--candidate, a dry run), or, "
        "with --offline, without a daemon.",
    )
    console_arguments(
        refresh_cmd, "the daemon's config file (finds its admin API); with --offline, the candidate"
    )
    refresh_cmd.add_argument(
        "--candidate",
        metavar="FILE",
        help="judge FILE against the running daemon's live state (a dry run; nothing is "
        "written or applied)",
    )
    refresh_cmd.add_argument(
        "--offline", metavar="RUNNING.yaml", help="compare against this file; no daemon needed"
    )
    modes = refresh_cmd.add_mutually_exclusive_group()
    modes.add_argument("--dry-run", action="store_true", help="report only (the default)")
    modes.add_argument("--apply", action="store_true", help="apply the live part")
    refresh_cmd.add_argument("--json", action="store_true", help=JSON_HELP)
    refresh_cmd.set_defaults(func=cmd_config_refresh)
