"""What ``iop-edge serve`` is asked to do, apart from the live objects that do it.

As uvicorn keeps its ``Config`` apart from its ``Server``: :class:`ServeOptions` is a frozen
value, built once from the command line (``iop-edge serve``, in :mod:`iop_edge.cli`) or by a
test, and read by :class:`iop_edge.daemon.Daemon` and what it builds; nothing changes it while
the process runs. The live parts — the loaded config, the clock, the logger, the sd_notify
socket, the listening sockets passed in, the metrics registry — are handed to the daemon beside
it, and the state of the running process lives in the objects it builds (the lifecycle phase in
:mod:`iop_edge.runtime.lifecycle`, the handover in :mod:`iop_edge.handover`).

Where each option comes from in ``serve``:

================== ===========================================================================
option             from
================== ===========================================================================
``config_path``    ``--config``
``env``            the environment, with ``--env-file`` read at every load
``drain_timeout``  ``--drain-timeout``
``watch``          always on (the config's ``reload.watch: false`` turns the watch off too)
``freeze_gc``      on
``argv``           the command that started the process (a restart runs it again)
``handover_fd``    ``IOP_EDGE_HANDOVER_FD``: set by the process this one takes over from
================== ===========================================================================
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from iop_edge.config.schema import EdgeConfig
from iop_edge.supervisor import SupervisorOptions

__all__ = ["DEFAULT_DRAIN_TIMEOUT", "ServeOptions"]

DEFAULT_DRAIN_TIMEOUT = 30.0
"""Seconds a stop may take (``--drain-timeout``)."""


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """How one ``iop-edge serve`` process runs (see the module docstring for the sources)."""

    #: the config file: watched and refreshed (the supervisor), read again by a restart;
    #: without one (embedded use, tests) the supervisor holds the config given, fixed, and
    #: there is no console or restart
    config_path: Path | None = None
    #: the variables the config's ``${VAR}`` references read
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    #: seconds from a stop's signal to the exit
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT
    #: timing of the file watch and of each refresh, and the seams tests drive
    supervisor_options: SupervisorOptions = field(default_factory=SupervisorOptions)
    #: watch the config file (tests turn it off)
    watch: bool = True
    #: ``gc.freeze()`` and the daemon's collector thresholds once started (the ``serve``
    #: command; tests share one process and don't)
    freeze_gc: bool = False
    #: the command that started this process: a restart runs it again
    argv: tuple[str, ...] = ()
    #: our end of the channel to the process we take over from (a handover), if any
    handover_fd: int | None = None

    def watches(self, config: EdgeConfig) -> bool:
        """Whether the config file is watched: asked for here, and not turned off by the
        config itself (``reload.watch: false``)."""
        return self.watch and config.reload.watch
