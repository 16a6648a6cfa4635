"""``iop-edge serve``: run the daemon until SIGTERM or SIGINT.

:mod:`iop_edge.cli` imports :mod:`iop_edge.runtime.parent` and :mod:`iop_edge.runtime.signals`
before this module and anything else: by the time this runs, SIGHUP and SIGUSR2 are remembered,
and outside systemd (unless ``--no-parent``) this process is the server the thin parent started. The
daemon's own modules are imported inside the command, not with the command line: the other
commands do not load them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from iop_edge.cli.arguments import CONFIG_HELP, EXIT_INVALID, default_config_path
from iop_edge.cli.config_commands import read_config
from iop_edge.cli.render import print_problems
from iop_edge.config import ConfigError
from iop_edge.config_file import ServiceEnvironment
from iop_edge.runtime import parent, signals


def cmd_serve(args: argparse.Namespace) -> int:
    """``iop-edge serve --config FILE``: run the daemon until SIGTERM/SIGINT."""
    from iop_edge.daemon import Daemon
    from iop_edge.handover.channel import HANDOVER_FD_ENV
    from iop_edge.options import ServeOptions
    from iop_edge.runtime.activation import ActivationError, inherited_sockets

    with signals.early_signals() as early:  # kept from its import-time handler, never default
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
            print_problems(exc, False)
            return EXIT_INVALID
        try:
            config = read_config(args.config, env)
        except ConfigError as exc:
            print(f"iop-edge serve: the config {args.config} is not valid:", file=sys.stderr)
            print_problems(exc, False)
            return EXIT_INVALID
        from iop_edge.runtime.logs import configure_logging, get_logger

        logs = configure_logging(config.logging.level, config.logging.format)
        options = ServeOptions(
            config_path=Path(args.config),
            env=env,
            drain_timeout=args.drain_timeout,
            freeze_gc=True,
            argv=tuple(own_command()),
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


def own_command() -> list[str]:
    """The command that started this process, runnable again (``iop-edge restart`` starts
    the successor with it, so an upgraded package takes effect)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None:  # `python -m iop_edge` (or iop_edge.cli): argv[0] is a module's file
        return [sys.executable, "-m", spec.name.removesuffix(".__main__"), *sys.argv[1:]]
    program = sys.argv[0]
    if os.sep not in program:
        program = shutil.which(program) or program
    return [os.path.abspath(program), *sys.argv[1:]]


def add_serve_command(sub: Any) -> None:
    """``iop-edge serve``, added to the subcommands ``sub``."""
    serve = sub.add_parser("serve", help="run the daemon", description="Run the daemon.")
    serve.add_argument("--config", metavar="FILE", default=default_config_path(), help=CONFIG_HELP)
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
