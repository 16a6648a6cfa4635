"""The ``iop-edge`` command line.

Exit codes: 0 success (or, for ``config refresh``, applied / nothing changed), 1 invalid input or
rejected, 2 usage error, 3 restart required.
"""

from __future__ import annotations

# Before every other import (they take a few hundred milliseconds). From here on a SIGHUP or
# SIGUSR2 sent to `iop-edge serve` is remembered for the daemon instead of killing the process
# (iop_edge.sighup); outside systemd the process runs, from this import on, as the thin parent
# of the server, and exits with the server's status (iop_edge.parent).
from iop_edge import parent, sighup

# isort: split

import argparse
import json
import os
import shutil
import sys
import textwrap
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NoReturn

import yaml
from pydantic import ValidationError

from iop_edge import __version__
from iop_edge.api.auth import ADMIN_TOKEN_ENV
from iop_edge.config import ConfigError, EdgeConfig, dump_config
from iop_edge.config.address import ListenAddress
from iop_edge.config.load import parse_yaml, problems_from_validation_error
from iop_edge.config.paths import item_label
from iop_edge.config.payload import node_payload
from iop_edge.config.redact import redact
from iop_edge.config.refresh import Outcome, RefreshResult, refresh
from iop_edge.config.schema import PrincipalToken
from iop_edge.config_file import (
    ServiceEnvironment,
    load_config_file,
    read_config_text,
    read_secret_file,
)
from iop_edge.runtime_record import find_record
from iop_edge.tokens import new_token, token_hash

# The exit codes of every command, in one table (README "Command line").
EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2
EXIT_RESTART = 3
#: What ``config refresh`` exits with for each refresh result.
REFRESH_EXIT: Final[dict[Outcome, int]] = {
    "applied": EXIT_OK,
    "rejected": EXIT_INVALID,
    "restart_required": EXIT_RESTART,
}

DEFAULT_CONFIG = "/etc/iop-edge/edge.yaml"


def default_config_path() -> str:
    """``$IOP_EDGE_CONFIG`` when set, else the packaged location ``/etc/iop-edge/edge.yaml``."""
    return os.environ.get("IOP_EDGE_CONFIG", DEFAULT_CONFIG)


def read_config(path: str, env: Mapping[str, str] | None = None) -> EdgeConfig:
    """Read and load a config file as the daemon does (:mod:`iop_edge.config_file`): an
    unreadable, non-regular, oversized or non-UTF-8 file becomes a one-line ConfigError.
    References resolve from ``env`` (default: this process's environment) and files."""
    return load_config_file(path, os.environ if env is None else env)


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
    data = redact(dump_config(config))
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), end="")
    return EXIT_OK


def cmd_config_payload(args: argparse.Namespace) -> int:
    """``iop-edge config payload --node ID [--config FILE] [--show-secrets]``: one node's
    payload as JSON, its secrets redacted as ``config show`` redacts them, and every value the
    config took from the environment or a file too, unless ``--show-secrets``."""
    try:
        config = read_config(args.config)
        payload = node_payload(config, args.node)
    except ConfigError as exc:
        _print_problems(exc, False)
        return EXIT_INVALID
    data = payload.model_dump(mode="json", exclude_none=True)
    if not args.show_secrets:
        data = redact(config.provenance.scrub(data))
    print(json.dumps(data, indent=2, ensure_ascii=False))
    return EXIT_OK


def format_refresh(result: RefreshResult) -> str:
    """A refresh result as a readable table (the JSON form is ``result.to_json()``)."""
    dry = result.mode == "dry_run"
    if dry:
        verdict = {
            "applied": "would apply",
            "restart_required": "would need a restart",
            "rejected": "would be rejected",
        }[result.result]
        lines = [f"result: {verdict} (dry run: nothing was applied)"]
    else:
        lines = [f"result: {result.result} (mode {result.mode})"]
    for label, ids in (
        ("nodes", result.changed_nodes),
        ("providers", result.changed_providers),
        ("models", result.changed_models),
    ):
        if ids:
            lines.append(f"changed {label}: {', '.join(ids)}")
    if result.report:
        # A dry run says what an apply would take: the live changes, unless they cannot
        # stand alone (errors).
        would = not result.errors
        rows = [("CLASS", "WOULD APPLY" if dry else "APPLIED", "PATH", "OLD", "NEW")] + [
            (
                e.change_class,
                "yes" if (e.change_class == "live" and would if dry else e.applied) else "no",
                e.path,
                _cell(e.old),
                _cell(e.new),
            )
            for e in result.report
        ]
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        lines.append("")
        lines += [
            "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:4])) + "  " + row[4]
            for row in rows
        ]
    elif result.result != "rejected":
        lines.append("no changes")
    if result.errors:
        lines.append("")
        lines.append("errors:")
        lines += [f"  {e.path}: {e.message}" if e.path else f"  {e.message}" for e in result.errors]
    if result.config_hash:
        lines.append("")
        lines.append(f"running config hash: {result.config_hash}")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text if len(text) <= 60 else text[:57] + "..."


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
                _print_problems(exc, False)
                return EXIT_INVALID
        data = _call_console(
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
        _print_problems(exc, False)
        return EXIT_INVALID
    source = args.candidate or args.config
    try:
        text = read_config_text(source)
    except ConfigError as exc:
        _print_problems(exc, False)
        return EXIT_INVALID
    result = refresh(
        running, text, mode=mode, env=os.environ, read_file=read_secret_file, source=source
    ).result
    print(json.dumps(result.to_json(), indent=2) if args.json else format_refresh(result))
    return REFRESH_EXIT[result.result]


def cmd_serve(args: argparse.Namespace) -> int:
    """``iop-edge serve --config FILE``: run the daemon until SIGTERM/SIGINT."""
    from iop_edge.activation import ActivationError, inherited_sockets
    from iop_edge.daemon import Daemon
    from iop_edge.handover.channel import HANDOVER_FD_ENV
    from iop_edge.options import ServeOptions

    with sighup.early_signals() as early:  # kept from its import-time handler, never default
        try:
            inherited = inherited_sockets()
            handover = os.environ.pop(HANDOVER_FD_ENV, None)
        except ActivationError as exc:
            print(f"iop-edge serve: the sockets passed in are not usable: {exc}", file=sys.stderr)
            return EXIT_INVALID
        # --env-file is read at every load (here, each refresh, the new process of a handover).
        env = ServiceEnvironment(os.environ, args.env_file and os.path.abspath(args.env_file))
        try:
            env.variables()
        except ConfigError as exc:
            print(f"iop-edge serve: the env file {args.env_file} is not usable:", file=sys.stderr)
            _print_problems(exc, False)
            return EXIT_INVALID
        try:
            config = read_config(args.config, env)
        except ConfigError as exc:
            print(f"iop-edge serve: the config {args.config} is not valid:", file=sys.stderr)
            _print_problems(exc, False)
            return EXIT_INVALID
        from iop_edge.logs import configure_logging, get_logger

        logs = configure_logging(config.logging.level, config.logging.format)
        options = ServeOptions(
            config_path=Path(args.config),
            env=env,
            drain_timeout=args.drain_timeout,
            freeze_gc=True,
            argv=tuple(_own_command()),
            handover_fd=int(handover) if handover else None,
        )
        daemon = Daemon(
            config,
            options,
            log=(log := get_logger()),
            write_request_line=logs.request_line_writer(log),
            inherited=inherited,
        )
        import uvloop

        from iop_edge.errors import ListenError

        try:
            return uvloop.run(daemon.run(early_signals=early))
        except ListenError as exc:  # (the daemon has stopped what it had started)
            print(f"iop-edge serve: {exc}", file=sys.stderr)
            return EXIT_INVALID


DEFAULT_CONSOLE = "127.0.0.1:7601"


@dataclass(frozen=True, slots=True)
class AdminAddress:
    """Where the admin API is, and how the command line knows (named in every error)."""

    url: str
    source: str


def _loopback_url(listen: str) -> str:
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
    default = AdminAddress(_loopback_url(DEFAULT_CONSOLE), "the default console.listen")
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
        url = _loopback_url(listen if isinstance(listen, str) else "")
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


def _admin_token(args: argparse.Namespace) -> str | None:
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


def _admin_call(url: str, method: str = "GET", token: str | None = None, body: Any = None) -> Any:
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


def _call_console(
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
        return _admin_call(url, method, _admin_token(args), body)
    except AdminCallError as exc:
        print(f"iop-edge {command}: {exc}", file=sys.stderr)
    except OSError as exc:
        print(
            f"iop-edge {command}: cannot reach the admin API at {url} ({address.source}): "
            f"{exc}{hint}",
            file=sys.stderr,
        )
    return None


def cmd_status(args: argparse.Namespace) -> int:
    """``iop-edge status [--json]``: the running daemon's status, from its admin API."""
    status = _call_console("status", args, "/admin/status", "GET")
    if status is None:
        return EXIT_INVALID
    print(json.dumps(status, indent=2) if args.json else format_status(status))
    return EXIT_OK


def _own_command() -> list[str]:
    """The command that started this process, runnable again (``iop-edge restart`` starts
    the successor with it, so an upgraded package takes effect)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None:  # `python -m iop_edge` (or iop_edge.cli): argv[0] is a module's file
        return [sys.executable, "-m", spec.name.removesuffix(".__main__"), *sys.argv[1:]]
    program = sys.argv[0]
    if os.sep not in program:
        program = shutil.which(program) or program
    return [os.path.abspath(program), *sys.argv[1:]]


def cmd_restart(args: argparse.Namespace) -> int:
    """``iop-edge restart``: hand the running daemon over to a new process (admin API)."""
    result = _call_console("restart", args, "/admin/restart", "POST")
    if result is None:
        return EXIT_INVALID
    if args.json:
        print(json.dumps(result, indent=2))
    elif result["result"] == "handed_over":
        print(f"handed over to process {result['pid']}; this one drains and exits")
    else:
        print(f"not restarted ({result['result']}): {result['message']}")
        for error in result.get("errors", ()):
            print(f"  {error['path']}: {error['message']}")
    return EXIT_OK if result["result"] == "handed_over" else EXIT_INVALID


def format_status(status: dict[str, Any]) -> str:
    """``/admin/status`` as a readable table."""
    config = status["config"]
    queue = status["queue"]
    timeout = queue["queue_timeout_ms"]
    lines = [
        f"edge {status['edge']} (pid {status.get('pid', '?')}): config "
        f"{config['hash'][:12]} (generation {config['generation']}) from {config['path']}",
        f"queue: {queue['depth']} pending (max {queue['max_queue']}, timeout "
        f"{f'{timeout} ms' if timeout else 'none'})",
    ]
    if config.get("watch") is False:
        lines.append(
            "config file not watched (reload.watch: false): refresh with SIGHUP "
            "(systemctl reload) or iop-edge config refresh --apply"
        )
    taken = status.get("handover")
    if taken:
        lines.append(
            f"took over from process {taken['from_pid']} at {taken['at']} in "
            f"{taken['duration_ms']:g} ms: {taken['inherited_leases']} slot(s) inherited "
            f"({taken['inherited_held']} still held), {taken['relayed_requests']} request(s) "
            f"relayed; the old process {'still drains' if taken['old_running'] else 'exited'}"
        )
    last = config.get("last_refresh")
    if last:
        lines.append(f"last refresh: {last['result']} ({last['trigger']})")
        lines += [f"  error: {e['path']}: {e['message']}" for e in last["errors"]]
    pending = config["restart_pending"]
    if pending:
        lines.append(f"restart pending for {len(pending)} change(s):")
        lines += [f"  {p['path']}: {_cell(p['old'])} -> {_cell(p['new'])}" for p in pending]
    rows = [("NODE", "PROVIDER", "STATUS", "HEALTH", "IN_FLIGHT", "CAPACITY", "LONG", "PRIORITY")]
    rows += [
        (
            p["node"],
            p["id"],
            p["status"],
            p["health"],
            str(p["in_flight"]),
            str(p["capacity"]),
            f"{p['long_in_flight']}/{p['long_context_capacity']}",
            str(p["priority"]),
        )
        for p in status["providers"]
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines.append("")
    lines += ["  ".join(c.ljust(widths[i]) for i, c in enumerate(row)).rstrip() for row in rows]
    for p in status["providers"]:
        lines += _health_lines(p)
    for model in status.get("models", ()):
        if model["panic"] and not model.get("derived_from"):  # (a model's panic, once)
            lines.append(
                f"model {model['id']}: PANIC - every enabled provider is ejected; health is "
                "ignored for it until one recovers"
            )
    lines += _principal_lines(status.get("principals", ()))
    counters = status["counters"]
    rejected = ", ".join(f"{k} {v}" for k, v in sorted(counters["rejected"].items()) if v)
    lines.append("")
    lines.append(
        f"admitted {counters['admitted']}, inherited {counters.get('inherited', 0)}, released "
        f"{counters['released']}, failovers {counters.get('failovers', 0)}, rejected: "
        f"{rejected or 'none'}"
    )
    return "\n".join(lines)


def _principal_lines(principals: Sequence[dict[str, Any]]) -> list[str]:
    """The fair-share table: one row per principal (SPEC §5.2); ``-`` is no limit."""

    def limit(value: object) -> str:
        return "-" if value is None else str(value)

    rows = [("PRINCIPAL", "WEIGHT", "IN_FLIGHT", "QUEUED", "MAX_IN_FLIGHT", "MAX_QUEUED", "RPM")]
    rows += [
        (
            p["principal"],
            f"{p['weight']:g}",
            str(p["in_flight"]),
            str(p["queued"]),
            limit(p["max_in_flight"]),
            limit(p["max_queued"]),
            limit(p["max_requests_per_minute"]),
        )
        for p in principals
    ]
    if len(rows) == 1:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [""]
    lines += ["  ".join(c.ljust(widths[i]) for i, c in enumerate(row)).rstrip() for row in rows]
    for p in principals:
        refused = ", ".join(f"{k} {v}" for k, v in sorted(p["rejected"].items()) if v)
        if refused:
            lines.append(f"principal {p['principal']}: rejected {refused}")
    return lines


def _health_lines(provider: dict[str, Any]) -> list[str]:
    """What an operator needs about a provider that is not plainly healthy."""
    name = f"{provider['node']}/{provider['id']}"
    lines = []
    if provider.get("ejected_until"):
        lines.append(
            f"{name}: ejected until {provider['ejected_until']} after "
            f"{provider['consecutive_failures']} consecutive failure(s)"
        )
    elif provider.get("half_open"):
        lines.append(f"{name}: half-open, the next request is a trial")
    if lines and provider.get("probes_trusted") is False:
        lines.append(
            "  its probes pass but its requests fail: probes no longer end its ejections "
            "(each runs to its end, then one trial request) until a request succeeds"
        )
    if provider.get("held_until"):
        lines.append(f"{name}: held out until {provider['held_until']} (429 Retry-After)")
    if lines and provider.get("last_failure"):
        lines.append(f"  last failure: {provider['last_failure']}")
    return lines


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


class _HelpFormatter(argparse.HelpFormatter):
    """Help text wrapped at spaces only (a path like /etc/iop-edge/edge.yaml stays whole)."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


DESCRIPTION = (
    "iop-edge: one OpenAI-compatible endpoint in front of a pool of LLM providers. Exit codes: "
    "0 success (for config refresh: applied, or nothing changed), 1 invalid input or rejected, "
    "2 usage error, 3 restart required."
)
_ADMIN_TOKEN_HELP = f"read the admin token from FILE (default: ${ADMIN_TOKEN_ENV})"
_CONFIG_HELP = f"the config file (default: $IOP_EDGE_CONFIG, else {DEFAULT_CONFIG})"
_JSON_HELP = "print JSON instead of text"


def _config_file_arguments(parser: argparse.ArgumentParser) -> None:
    """``[FILE]`` and ``--config FILE``: the same file (the positional form is kept as an
    alias); :func:`main` puts the one given in ``args.file``."""
    parser.add_argument(
        "file", nargs="?", default=None, metavar="FILE", help="the config file (as --config)"
    )
    parser.add_argument("--config", metavar="FILE", help=_CONFIG_HELP)


def _console_arguments(parser: argparse.ArgumentParser, config_help: str) -> None:
    """How a command finds and reaches the running daemon's admin API."""
    parser.add_argument("--config", metavar="FILE", default=default_config_path(), help=config_help)
    parser.add_argument("--console", metavar="URL", help="the admin API's base URL")
    parser.add_argument("--admin-token-file", metavar="FILE", help=_ADMIN_TOKEN_HELP)


def _subcommands(parser: argparse.ArgumentParser, dest: str) -> Any:
    return parser.add_subparsers(
        dest=dest, required=True, parser_class=_Parser, metavar="COMMAND", title="commands"
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand. Help is plain text: no markup, and every
    placeholder says what goes there (FILE, URL, ID, NAME, COMMAND)."""
    parser = _Parser(prog="iop-edge", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"iop-edge {__version__}")
    sub = _subcommands(parser, "command")

    serve = sub.add_parser("serve", help="run the daemon", description="Run the daemon.")
    serve.add_argument("--config", metavar="FILE", default=default_config_path(), help=_CONFIG_HELP)
    serve.add_argument(
        "--env-file",
        metavar="FILE",
        help="KEY=VALUE lines (systemd EnvironmentFile syntax) for ${VAR} in the config, over "
        "the environment; read again at every refresh and by the new process of iop-edge "
        "restart, so a rotated secret takes effect without a gap",
    )
    serve.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM, how long in-flight and queued requests may take (default 30)",
    )
    serve.add_argument(
        parent.NO_PARENT,
        action="store_true",
        help="run the server in this process (outside systemd it otherwise runs as the child "
        "of a thin parent that stays across restarts and reaps orphans)",
    )
    serve.set_defaults(func=cmd_serve)

    status = sub.add_parser(
        "status",
        help="the running daemon's status (admin API)",
        description="Print the running daemon's status, from its admin API.",
    )
    _console_arguments(status, "the daemon's config file (to find its admin API)")
    status.add_argument("--json", action="store_true", help=_JSON_HELP)
    status.set_defaults(func=cmd_status)

    restart = sub.add_parser(
        "restart",
        help="hand the running daemon over to a new process, without a gap",
        description="Hand the running daemon over to a new process running the same command "
        "line, without a gap (the new process reads the config, --env-file and ${file:} "
        "files again).",
    )
    _console_arguments(restart, "the daemon's config file (to find its admin API)")
    restart.add_argument("--json", action="store_true", help=_JSON_HELP)
    restart.set_defaults(func=cmd_restart)

    config = sub.add_parser(
        "config",
        help="validate, show and compare configs",
        description="Validate, show and compare configs.",
    )
    config_sub = _subcommands(config, "config_command")

    validate = config_sub.add_parser(
        "validate",
        help="check a config; exit 1 listing every problem",
        description="Check a config; exit 1 listing every problem.",
    )
    _config_file_arguments(validate)
    validate.add_argument("--json", action="store_true", help='print {"valid", "errors"}')
    validate.set_defaults(func=cmd_config_validate)

    show = config_sub.add_parser(
        "show",
        help="print the effective config (secrets redacted)",
        description="Print the effective config, secrets redacted.",
    )
    _config_file_arguments(show)
    show.add_argument("--json", action="store_true", help=_JSON_HELP)
    show.set_defaults(func=cmd_config_show)

    payload = config_sub.add_parser(
        "payload",
        help="print one node's NodeConfigPayload as JSON (secrets redacted)",
        description="Print one node's NodeConfigPayload as JSON, secrets redacted as by config "
        "show, and every value taken from the environment or a file too.",
    )
    payload.add_argument("--node", metavar="ID", required=True, help="the node's id")
    payload.add_argument(
        "--config", metavar="FILE", default=default_config_path(), help=_CONFIG_HELP
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
    _console_arguments(
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
    refresh_cmd.add_argument("--json", action="store_true", help=_JSON_HELP)
    refresh_cmd.set_defaults(func=cmd_config_refresh)

    token = sub.add_parser(
        "token",
        help="principal and admin tokens",
        description="Make principal and admin tokens.",
    )
    token_sub = _subcommands(token, "token_command")
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
    new.add_argument("--json", action="store_true", help=_JSON_HELP)
    new.set_defaults(func=cmd_token_new)
    admin = token_sub.add_parser(
        "admin",
        help="generate an admin token and its console.admin_token_sha256",
        description="Generate an admin token (printed once) and its hash for "
        "console.admin_token_sha256.",
    )
    admin.add_argument("--json", action="store_true", help=_JSON_HELP)
    admin.set_defaults(func=cmd_token_admin)
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


if __name__ == "__main__":
    sys.exit(main())
