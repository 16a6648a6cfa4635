"""The command line's client of the running daemon's admin API (``console`` in the config):
where that API is (``--console``, the daemon's runtime record, or the config file), the admin
token, and one JSON call over HTTP (standard library only), its refusals and failures as
one-line messages naming the address and how it was found."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iop_edge.api.auth import ADMIN_TOKEN_ENV
from iop_edge.config import ConfigError
from iop_edge.config.address import ListenAddress
from iop_edge.config.load import parse_yaml
from iop_edge.config_file import read_config_text
from iop_edge.runtime_record import find_record

DEFAULT_CONSOLE = "127.0.0.1:7601"
"""``console.listen`` when the config sets none."""


@dataclass(frozen=True, slots=True)
class AdminAddress:
    """Where the admin API is, and how the command line knows (named in every error)."""

    url: str
    source: str


def loopback_url(listen: str) -> str:
    """The URL that reaches a listen address from this machine (a wildcard through
    loopback)."""
    address = ListenAddress.parse(listen)
    if address.is_wildcard:  # listening everywhere: loopback reaches it
        address = ListenAddress("127.0.0.1", address.port)
    return address.url()


def admin_address(command: str, args: argparse.Namespace) -> AdminAddress | None:
    """The admin API of the daemon serving ``--config FILE``, in this order:

    1. ``--console URL``;
    2. the address that daemon recorded in its runtime directory (:mod:`iop_edge.runtime_record`):
       right even when the file changed since, no longer loads, or asked for port 0;
    3. ``console.listen`` of the file (read leniently: a candidate that does not validate
       still names its daemon), or its default when the file sets none.

    When the file cannot be read or parsed, or its ``console.listen`` is not an address, the
    default address is used and a line on stderr says so. ``None`` (the reason printed) when
    the file disables the console.
    """
    if args.console:
        return AdminAddress(str(args.console).rstrip("/"), "--console")
    record = find_record(args.config, os.environ)
    if record is not None:
        return AdminAddress(
            record.console,
            f"recorded by the daemon of {args.config}, pid {record.pid}, in {record.path}",
        )
    default = AdminAddress(loopback_url(DEFAULT_CONSOLE), "the default console.listen")
    try:
        data = parse_yaml(read_config_text(args.config), source=args.config)
    except ConfigError as exc:
        why = exc.problems[0].message if exc.problems else str(exc)
        print(
            f"iop-edge {command}: the config {args.config} does not load ({why}) and no "
            f"running daemon recorded an admin address for it; trying the default "
            f"{DEFAULT_CONSOLE} (pass --console URL, or --config the daemon's file)",
            file=sys.stderr,
        )
        return default
    console = data.get("console") if isinstance(data, dict) else None
    if not isinstance(console, dict):
        return AdminAddress(default.url, f"the default console.listen ({args.config} sets none)")
    if console.get("enabled") is False:
        print(
            f"iop-edge {command}: console.enabled is false in {args.config}: its daemon has "
            "no admin API to ask (pass --console URL if another one has)",
            file=sys.stderr,
        )
        return None
    listen = console.get("listen", DEFAULT_CONSOLE)
    try:
        url = loopback_url(listen if isinstance(listen, str) else "")
    except ValueError:
        print(
            f"iop-edge {command}: console.listen in {args.config} is not an address "
            f"({listen!r}); trying the default {DEFAULT_CONSOLE} (pass --console URL)",
            file=sys.stderr,
        )
        return default
    return AdminAddress(url, f"console.listen in {args.config}")


class AdminCallError(Exception):
    """The admin API refused a call (its error message included), or the admin token could
    not be read."""


def admin_token(args: argparse.Namespace) -> str | None:
    """The admin token: ``--admin-token-file FILE`` (its first line), else
    ``$IOP_EDGE_ADMIN_TOKEN``; None when neither is given. Never an argument on the command
    line itself: other users of the machine could read it in the process list."""
    path = getattr(args, "admin_token_file", None)
    if path:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise AdminCallError(f"cannot read the admin token file {path}: {exc}") from None
        return lines[0].strip() if lines else None
    return os.environ.get(ADMIN_TOKEN_ENV) or None


def admin_call(url: str, method: str = "GET", token: str | None = None, body: Any = None) -> Any:
    """One JSON call to the admin API (stdlib only), with the admin token when there is one
    and ``body`` as JSON when given. Raises OSError when it is unreachable,
    :class:`AdminCallError` when it refuses."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = None
    if body is not None:
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            raw = exc.read()
        try:
            message = json.loads(raw)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = raw.decode("utf-8", errors="replace").strip()[:300]
        hint = ""
        if exc.code == 401 and not token:
            hint = f" (no admin token was sent: set {ADMIN_TOKEN_ENV} or --admin-token-file)"
        raise AdminCallError(
            f"the admin API at {url} refused the request with HTTP {exc.code}: {message}{hint}"
        ) from None


def call_console(
    command: str,
    args: argparse.Namespace,
    path: str,
    method: str,
    body: Any = None,
    hint: str = "",
) -> Any:
    """One admin API call for ``iop-edge COMMAND``; ``None`` (the reason printed) when it
    was refused or the API is unreachable (``hint`` is added to that message)."""
    address = admin_address(command, args)
    if address is None:
        return None
    url = address.url + path
    try:
        return admin_call(url, method, admin_token(args), body)
    except AdminCallError as exc:
        print(f"iop-edge {command}: {exc}", file=sys.stderr)
    except OSError as exc:
        print(
            f"iop-edge {command}: cannot reach the admin API at {url} ({address.source}): "
            f"{exc}{hint}",
            file=sys.stderr,
        )
    return None
