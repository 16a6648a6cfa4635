"""``iop-edge token new|admin``: a new principal token and its ``openai.principal_tokens``
entry, or a new admin token and its ``console.admin_token_sha256``; each token is printed once,
the config keeps only its hash."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import yaml
from pydantic import ValidationError

from iop_edge.api.auth import ADMIN_TOKEN_ENV
from iop_edge.cli.arguments import EXIT_OK, EXIT_USAGE, JSON_HELP, subcommands
from iop_edge.config.load import problems_from_validation_error
from iop_edge.config.paths import item_label
from iop_edge.config.schema import PrincipalToken
from iop_edge.tokens import new_token, token_hash


def cmd_token_new(args: argparse.Namespace) -> int:
    """``iop-edge token new``: print a new token once, and its config entry with the hash."""
    token = new_token()
    fields = {
        "token_ref": args.token_ref,
        "token_hash_sha256": token_hash(token),
        "principal_ref": args.principal_ref,
    }
    if args.alias is not None:
        fields["principal_alias"] = args.alias
    try:
        entry = PrincipalToken.model_validate(fields)
    except ValidationError as exc:
        # The lines `config validate` would print for this entry in a config file.
        where = f"openai.principal_tokens[{item_label('principal_tokens', fields, 0)}]"
        for problem in problems_from_validation_error(exc, fields):
            print(f"{where}.{problem.path}: {problem.message}", file=sys.stderr)
        return EXIT_USAGE
    data = entry.model_dump(exclude_none=True)
    if args.json:
        print(json.dumps({"token": token, "principal_token": data}, indent=2))
        return EXIT_OK
    print(f"token (shown only now; give it to the client and keep no copy): {token}")
    print("# add under openai.principal_tokens in edge.yaml:")
    print(yaml.safe_dump([data], sort_keys=False, default_flow_style=None), end="")
    print(
        "# principal tokens are restart-class: the token is accepted once the daemon restarts; "
        "`iop-edge restart` does that without a gap (a refresh only reports the change)",
        file=sys.stderr,
    )
    return EXIT_OK


def cmd_token_admin(args: argparse.Namespace) -> int:
    """``iop-edge token admin``: print a new admin token once, and its hash for
    ``console.admin_token_sha256``."""
    token = new_token()
    digest = token_hash(token)
    if args.json:
        print(json.dumps({"token": token, "console": {"admin_token_sha256": digest}}, indent=2))
        return EXIT_OK
    print(
        "admin token (shown only now; give it to iop-edge status / config refresh through "
        f"${ADMIN_TOKEN_ENV} or --admin-token-file, and keep no other copy): {token}"
    )
    print("# set in edge.yaml (then restart the daemon):")
    print(f"console:\n  admin_token_sha256: {digest}")
    return EXIT_OK


def add_token_commands(sub: Any) -> None:
    """``iop-edge token`` and its subcommands, added to the subcommands ``sub``."""
    token = sub.add_parser(
        "token",
        help="principal and admin tokens",
        description="Make principal and admin tokens.",
    )
    token_sub = subcommands(token, "token_command")
    new = token_sub.add_parser(
        "new",
        help="generate a token and its principal_tokens entry",
        description="Generate a principal token (printed once) and its "
        "openai.principal_tokens entry, which holds only its hash.",
    )
    new.add_argument(
        "--token-ref", metavar="NAME", required=True, help="unique name of this token (app, use)"
    )
    new.add_argument(
        "--principal-ref", metavar="NAME", required=True, help="who the token belongs to"
    )
    new.add_argument("--alias", metavar="NAME", help="display name of the principal")
    new.add_argument("--json", action="store_true", help=JSON_HELP)
    new.set_defaults(func=cmd_token_new)
    admin = token_sub.add_parser(
        "admin",
        help="generate an admin token and its console.admin_token_sha256",
        description="Generate an admin token (printed once) and its hash for "
        "console.admin_token_sha256.",
    )
    admin.add_argument("--json", action="store_true", help=JSON_HELP)
    admin.set_defaults(func=cmd_token_admin)
