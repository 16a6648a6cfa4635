"""How a restart ended (:meth:`iop_edge.handover.coordinator.HandoverCoordinator.restart`).

One frozen value per outcome; ``to_json()`` is the one rendering, which ``POST /admin/restart``
answers (409 ``daemon_stopping`` when its ``phase`` is ``stopping``) and ``SIGUSR2`` logs
(``restart_refused``) when it did not hand over:

- :class:`HandedOver`: the new process took over; this one drains.
- :class:`RestartFailed`: the new process did not start or become ready; this one serves on.
- :class:`RestartRefused`: nothing was started (the phase, no command, a config that does not
  load).
- :class:`RestartCancelled`: a stop began during the handover; the new process was stopped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from iop_edge.errors import ConfigProblem
from iop_edge.runtime.lifecycle import Phase

__all__ = [
    "HandedOver",
    "RestartCancelled",
    "RestartFailed",
    "RestartRefused",
    "RestartResult",
]


@dataclass(frozen=True, slots=True)
class HandedOver:
    """The new process took over (its ``pid``); this one drains."""

    pid: int

    def to_json(self) -> dict[str, Any]:
        """The answer of ``POST /admin/restart``."""
        return {"result": "handed_over", "pid": self.pid}


@dataclass(frozen=True, slots=True)
class RestartFailed:
    """The new process did not start or did not become ready; this one serves on."""

    message: str

    def to_json(self) -> dict[str, Any]:
        """The answer of ``POST /admin/restart``."""
        return {"result": "failed", "message": self.message}


@dataclass(frozen=True, slots=True)
class RestartRefused:
    """Nothing was started: the ``phase`` forbids it, there is no command to run, or the
    config file does not load (its ``errors``)."""

    message: str
    phase: Phase | None = None
    errors: tuple[ConfigProblem, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        """The answer of ``POST /admin/restart`` (``rejected``)."""
        answer: dict[str, Any] = {"result": "rejected"}
        if self.phase is not None:
            answer["phase"] = self.phase.value
        answer["message"] = self.message
        if self.errors is not None:
            answer["errors"] = [{"path": p.path, "message": p.message} for p in self.errors]
        return answer


@dataclass(frozen=True, slots=True)
class RestartCancelled:
    """A stop began during the handover: the new process was stopped (``exit_code``)."""

    exit_code: int

    def to_json(self) -> dict[str, Any]:
        """The answer of ``POST /admin/restart`` (``rejected`` in the phase ``stopping``)."""
        return {
            "result": "rejected",
            "phase": Phase.STOPPING.value,
            "message": "the daemon began to stop during the handover: the new process was "
            f"stopped (exit code {self.exit_code}) and nothing was restarted",
        }


RestartResult = HandedOver | RestartFailed | RestartRefused | RestartCancelled
"""How a restart ended."""
