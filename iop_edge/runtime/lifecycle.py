"""The lifecycle phase of a running ``iop-edge serve`` process (issue 25).

One object holds the phase. The daemon moves it through starting, ready and stopping, its
handover coordinator (:mod:`iop_edge.handover.coordinator`) through handing over and draining;
the parts that decide by it read it: a restart asked over the admin API or by ``SIGUSR2``, the
stop, and the OpenAI surface's ``/readyz``. Its moves::

    starting ──► ready ──► handing_over ──► draining
        │          │  ◄──────┘  │               │
        └──────────┴────────────┴───────────────┴──► stopping

- ``starting``: the listeners are bound, a predecessor's leases counted; nothing is served yet.
- ``ready``: serving. The one phase a restart may begin in.
- ``handing_over``: a restart runs: a new process starts and takes the listeners over. It ends
  ``ready`` again when the new process fails, ``draining`` when it took over.
- ``draining``: handed over; this process finishes its requests, then exits.
- ``stopping``: ``SIGTERM``/``SIGINT`` (or a start that failed): it drains and exits. Nothing
  leaves this phase: a stop never becomes a restart.
"""

from __future__ import annotations

import enum
from typing import Final

__all__ = ["Lifecycle", "LifecycleError", "Phase"]


class Phase(enum.Enum):
    """Where a daemon process is in its life (see the module docstring)."""

    STARTING = "starting"
    READY = "ready"
    HANDING_OVER = "handing_over"
    DRAINING = "draining"
    STOPPING = "stopping"


_MOVES: Final[dict[Phase, frozenset[Phase]]] = {
    Phase.STARTING: frozenset({Phase.READY, Phase.STOPPING}),
    Phase.READY: frozenset({Phase.HANDING_OVER, Phase.STOPPING}),
    Phase.HANDING_OVER: frozenset({Phase.READY, Phase.DRAINING, Phase.STOPPING}),
    Phase.DRAINING: frozenset({Phase.STOPPING}),
    Phase.STOPPING: frozenset({Phase.STOPPING}),  # (a second stop changes nothing)
}

_RESTART_REFUSALS: Final[dict[Phase, str]] = {
    Phase.STARTING: "the daemon is starting: it runs the program and config it has just "
    "loaded; ask again once it is ready to restart it",
    Phase.HANDING_OVER: "a handover is already in progress",
    Phase.DRAINING: "this process has handed over to a new one and drains; restart that one",
    Phase.STOPPING: "the daemon is stopping: it drains and exits, and a new process would keep "
    "serving after it; nothing was restarted",
}


class LifecycleError(RuntimeError):
    """A move the lifecycle does not allow: a bug in the daemon, never an operator's doing."""


class Lifecycle:
    """The phase of this process; :meth:`enter` moves it, everything else only reads it."""

    __slots__ = ("_phase",)

    def __init__(self) -> None:
        self._phase = Phase.STARTING

    @property
    def phase(self) -> Phase:
        """The current phase."""
        return self._phase

    @property
    def stopping(self) -> bool:
        """Whether a stop has begun (it never ends but with the process)."""
        return self._phase is Phase.STOPPING

    def enter(self, phase: Phase) -> Phase:
        """Move to ``phase``; returns the phase left. :class:`LifecycleError` for a move the
        diagram in the module docstring does not have."""
        left = self._phase
        if phase not in _MOVES[left]:
            raise LifecycleError(f"the daemon cannot go from {left.value} to {phase.value}")
        self._phase = phase
        return left

    def restart_refusal(self) -> str | None:
        """Why a restart cannot begin now, or ``None`` (in ``ready``)."""
        return self.refusal_in(self._phase)

    @staticmethod
    def refusal_in(phase: Phase) -> str | None:
        """Why a restart cannot begin in ``phase``, or ``None`` (``ready``)."""
        return _RESTART_REFUSALS.get(phase)

    def __repr__(self) -> str:
        return f"<Lifecycle {self._phase.value}>"
