"""``iop-edge token new|admin|node``: a new principal token and its
``openai.principal_tokens`` entry, a new admin token and its ``console.admin_token_sha256``, or
a new node token and its ``nodes[].token_hash_sha256``; each token is printed once, the config
keeps only its hash."""

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
from iop_edge.config.schema import Node, PrincipalToken
from iop_edge.tokens import new_node_token, new_token, token_hash


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


def cmd_token_node(args: argparse.Namespace) -> int:
    """``iop-edge token node --node ID``: print a new node token once, and the
    ``token_hash_sha256`` line that makes ``nodes[ID]`` a remote node."""
    token = new_node_token()
    fields = {"id": args.node, "token_hash_sha256": token_hash(token)}
    try:
        node = Node.model_validate(fields)
    except ValidationError as exc:
        # The lines `config validate` would print for a node with this id.
        where = f"nodes[{item_label('nodes', fields, 0)}]"
        for problem in problems_from_validation_error(exc, fields):
            print(f"{where}.{problem.path}: {problem.message}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        entry = {"id": node.id, "token_hash_sha256": node.token_hash_sha256}
        print(json.dumps({"token": token, "node": entry}, indent=2))
        return EXIT_OK
    print(
        "node token (shown only now; put it in the node's token file, mode 0600, and keep no "
        f"other copy): {token}"
    )
    print(f"# set under nodes[{node.id}] in edge.yaml, then iop-edge restart:")
    print(f"token_hash_sha256: {node.token_hash_sha256}")
    print(
        "# node tokens are restart-class: the edge accepts the node once it restarts; "
        "`iop-edge restart` does that without a gap (a refresh only reports the change)",
        file=sys.stderr,
    )
    return EXIT_OK


def add_token_commands(sub: Any) -> None:
    """``iop-edge token`` and its subcommands, added to the subcommands ``sub``."""
    token = sub.add_parser(
        "token",
        help="principal, admin and node tokens",
        description="Make principal, admin and node tokens.",
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
    node = token_sub.add_parser(
        "node",
        help="generate a node token and its nodes[].token_hash_sha256",
        description="Generate a node token (printed once) for the iop-node agent of a remote "
        "node, and its hash for nodes[].token_hash_sha256, which makes the node remote.",
    )
    node.add_argument("--node", metavar="ID", required=True, help="the node's id")
    node.add_argument("--json", action="store_true", help=JSON_HELP)
    node.set_defaults(func=cmd_token_node)
