"""One request's record: what the request path learned about it, from which its log line and
its metrics are written (:class:`RequestRecord`), and who is told when it ends."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from iop_edge.adapters.base import Usage
from iop_edge.api.auth import Principal

__all__ = ["FailedAttempt", "RequestObserver", "RequestRecord"]


class FailedAttempt(NamedTuple):
    """An attempt that failed over to another provider."""

    node: str
    provider: str
    #: how it failed, for the provider's health and the failovers metric (``connect``, ...)
    kind: str
    #: the upstream-errors code: ``upstream_error``, ``upstream_timeout`` or ``http_<status>``
    code: str
    #: seconds from the attempt's start to its failure
    duration: float


@dataclass(slots=True)
class RequestRecord:
    """What one request did: the log line and the metrics are written from it."""

    request_id: str
    endpoint: str
    started: float
    principal: Principal | None = None
    model: str | None = None
    node: str | None = None
    provider: str | None = None
    stream: bool = False
    status: int = 0
    code: str = "ok"
    queue_wait: float | None = None
    time_to_first_token: float | None = None
    duration: float = 0.0
    usage: Usage = field(default_factory=Usage)
    #: the full error (adapter details included) for the log; clients get a shorter message
    error: str | None = None
    #: the model names a models[] group or a route (metrics label it; unknown ids are not)
    resolved: bool = False
    #: how the upstream failed: ``upstream_error``, ``upstream_timeout`` or ``http_<status>``
    upstream_failure: str | None = None
    #: status and code logged if the handler is cancelled: the client left, unless the edge
    #: itself cut the connection (a body that stopped arriving)
    cancelled_as: tuple[int, str] = (499, "client_gone")
    #: providers the request was sent to (0: it never got one)
    attempts: int = 0
    #: when the current (last) attempt started, on the request's clock
    attempt_started: float = 0.0
    #: the attempts that failed over to another provider, in order
    failovers: tuple[FailedAttempt, ...] = ()
    #: the agent session the request belongs to (``X-Claude-Code-Session-Id``, when valid)
    session_id: str | None = None

    def failed_over(self, kind: str, code: str, ended: float) -> None:
        """The attempt on the current provider failed (at ``ended``) before the client got a
        byte, and the request re-entered admission for another provider (it may still time
        out, be left, or lose its last untried provider while it waits)."""
        attempt = FailedAttempt(
            self.node or "", self.provider or "", kind, code, ended - self.attempt_started
        )
        self.failovers = (*self.failovers, attempt)

    def log_fields(self) -> dict[str, Any]:
        """The fields of the request's log line (never a raw token)."""
        principal = self.principal
        return {
            "request_id": self.request_id,
            "principal_ref": principal.principal_ref if principal else None,
            "token_ref": principal.token_ref if principal else None,
            "model": self.model,
            "node": self.node,
            "provider": self.provider,
            "status": self.status,
            "code": self.code,
            "stream": self.stream,
            "queue_wait_ms": round(self.queue_wait * 1000, 3)
            if self.queue_wait is not None
            else None,
            "duration_ms": round(self.duration * 1000, 3),
            "prompt_tokens": self.usage.prompt_tokens,
            "completion_tokens": self.usage.completion_tokens,
            "usage_estimated": self.usage.estimated,
            "error": self.error,
            "attempts": self.attempts,
            "failed_over": [f"{f.node}/{f.provider}: {f.kind}" for f in self.failovers] or None,
            "session_id": self.session_id,
        }


RequestObserver = Callable[[RequestRecord], None]
