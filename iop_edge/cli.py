"""The ``iop-edge`` command line.

Exit codes: 0 success (or, for ``config refresh``, applied / nothing changed), 1 invalid input or
rejected, 2 usage error, 3 restart required.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import yaml

from iop_edge import __version__
from iop_edge.config import ConfigError, ConfigProblem, EdgeConfig, dump_config, load_config
from iop_edge.config.payload import node_payload
from iop_edge.config.schema import PrincipalToken
from iop_edge.tokens import new_token, token_hash

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2
EXIT_RESTART = 3

DEFAULT_CONFIG = "/etc/iop-edge/edge.yaml"
REDACTED = "<redacted>"


def default_config_path() -> str:
    """``$IOP_EDGE_CONFIG`` when set, else the packaged location ``/etc/iop-edge/edge.yaml``."""
    return os.environ.get("IOP_EDGE_CONFIG", DEFAULT_CONFIG)


def read_config(path: str) -> EdgeConfig:
    """Read and load a config file; unreadable files become a one-line ConfigError."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            [ConfigProblem("", f"cannot read config {path}: {exc.strerror or exc}")]
        ) from exc
    return load_config(text, env=os.environ, source=path)


def redacted(data: dict[str, Any]) -> dict[str, Any]:
    """A dumped config with every header and environment value hidden (they may hold secrets)."""

    def walk(value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            if key in ("headers", "env"):
                return dict.fromkeys(value, REDACTED)
            return {k: walk(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    result: dict[str, Any] = walk(data)
    return result


def _print_problems(exc: ConfigError, as_json: bool) -> None:
    if as_json:
        print(
            json.dumps(
                {
                    "valid": False,
                    "errors": [{"path": p.path, "message": p.message} for p in exc.problems],
                },
                indent=2,
            )
        )
        return
    for problem in exc.problems:
        print(problem, file=sys.stderr)


def cmd_config_validate(args: argparse.Namespace) -> int:
    """``iop-edge config validate [FILE] [--json]``."""
    try:
        read_config(args.file)
    except ConfigError as exc:
        _print_problems(exc, args.json)
        return EXIT_INVALID
    if args.json:
        print(json.dumps({"valid": True, "errors": []}, indent=2))
    else:
        print(f"{args.file}: valid")
    return EXIT_OK


def cmd_config_show(args: argparse.Namespace) -> int:
    """``iop-edge config show [FILE] [--json]``: the effective config, secrets redacted."""
    try:
        config = read_config(args.file)
    except ConfigError as exc:
        _print_problems(exc, False)
        return EXIT_INVALID
    data = redacted(dump_config(config))
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), end="")
    return EXIT_OK


def cmd_config_payload(args: argparse.Namespace) -> int:
    """``iop-edge config payload --node ID [--config FILE]``: one node's payload as JSON."""
    try:
        payload = node_payload(read_config(args.config), args.node)
    except ConfigError as exc:
        _print_problems(exc, False)
        return EXIT_INVALID
    print(payload.model_dump_json(indent=2, exclude_none=True))
    return EXIT_OK


def cmd_token_new(args: argparse.Namespace) -> int:
    """``iop-edge token new``: print a new token once, and its config entry with the hash."""
    token = new_token()
    try:
        entry = PrincipalToken(
            token_ref=args.token_ref,
            token_hash_sha256=token_hash(token),
            principal_ref=args.principal_ref,
            principal_alias=args.alias,
        )
    except ValueError as exc:
        print(f"iop-edge token new: {exc}", file=sys.stderr)
        return EXIT_USAGE
    data = entry.model_dump(exclude_none=True)
    if args.json:
        print(json.dumps({"token": token, "principal_token": data}, indent=2))
        return EXIT_OK
    print(f"token (shown only now; give it to the client and keep no copy): {token}")
    print("# add under openai.principal_tokens in edge.yaml:")
    print(yaml.safe_dump([data], sort_keys=False, default_flow_style=None), end="")
    return EXIT_OK


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = _Parser(prog="iop-edge", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"iop-edge {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    config = sub.add_parser("config", help="validate, show and compare configs")
    config_sub = config.add_subparsers(dest="config_command", required=True, parser_class=_Parser)

    validate = config_sub.add_parser(
        "validate", help="check a config; exit 1 listing every problem"
    )
    validate.add_argument("file", nargs="?", default=default_config_path())
    validate.add_argument("--json", action="store_true", help='print {"valid", "errors"}')
    validate.set_defaults(func=cmd_config_validate)

    show = config_sub.add_parser("show", help="print the effective config (secrets redacted)")
    show.add_argument("file", nargs="?", default=default_config_path())
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_config_show)

    payload = config_sub.add_parser("payload", help="print one node's NodeConfigPayload as JSON")
    payload.add_argument("--node", required=True, help="node id")
    payload.add_argument("--config", default=default_config_path())
    payload.set_defaults(func=cmd_config_payload)

    token = sub.add_parser("token", help="principal tokens")
    token_sub = token.add_subparsers(dest="token_command", required=True, parser_class=_Parser)
    new = token_sub.add_parser("new", help="generate a token and its principal_tokens entry")
    new.add_argument("--token-ref", required=True, help="unique name of this token (app, use)")
    new.add_argument("--principal-ref", required=True, help="who the token belongs to")
    new.add_argument("--alias", help="display name of the principal")
    new.add_argument("--json", action="store_true")
    new.set_defaults(func=cmd_token_new)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``iop-edge`` console script."""
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
