"""One provider's health as a sans-IO state machine (SPEC §5.1): times are passed in.

States, and what moves between them::

    unknown ──success──▶ healthy ◀──────────── success (a request, a probe, the trial)
       │                    │                          ▲
       └──── failure_threshold consecutive failures ───┼──▶ ejected (until T)
                                                       │      │  probes every probe_interval
                                      no health check, │      ▼  (with a health check)
                                      or no probe came │   at T: the last probe failed → ejected
                                      back before T    │         again, for twice as long
                                                       └── half-open: one trial request;
                                                           its failure ejects again (doubled)

- A failure is counted only when it is the provider's (connect, timeout, 5xx, exit, a broken
  answer); a 429 holds the provider out for its ``Retry-After`` without counting toward
  ejection. A success resets the consecutive failures and ends an ejection at once; only a
  success of a real request (not of a probe) resets the doubling.
- ``out`` — ejected or held — providers are not dispatch candidates unless their model group is
  in panic (every enabled member out); the scheduler decides that, this module only keeps one
  provider's state.

Every method that changes something returns the :class:`HealthEvent` to log (or ``None``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Literal

from iop_edge.errors import FailureKind
from iop_edge.pool.policy import HealthPolicy

OK: Final = "ok"
"""The outcome of an attempt the provider answered (its answer, or the client's 4xx)."""


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed attempt: its kind, a sentence for the log and status, and for a 429 the
    seconds its ``Retry-After`` asked for."""

    kind: FailureKind
    reason: str
    retry_after: float | None = None


Outcome = Failure | Literal["ok"] | None
"""How an attempt ended for the provider's health: :data:`OK`, a :class:`Failure`, or
``None`` when it says nothing about the provider (the client left first)."""


class Health(StrEnum):
    """A provider's health as the status API shows it (``disabled`` is the scheduler's)."""

    UNKNOWN = "unknown"
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"


class _State(StrEnum):
    UNKNOWN = "unknown"
    HEALTHY = "healthy"
    EJECTED = "ejected"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """Something to log about one provider's health.

    ``kind``: ``ejected`` (``until`` set; ``failures`` consecutive failures, the last one
    ``reason``), ``recovered`` (``via`` is ``request``, ``probe`` or ``trial``),
    ``half_open`` (the ejection ran out: one trial request may go), ``held`` (a 429 holds it
    out ``until``); for a model group, ``panic`` (every member out: health is ignored) and
    ``panic_over``.
    """

    kind: Literal["ejected", "recovered", "half_open", "held", "panic", "panic_over"]
    failures: int = 0
    reason: str | None = None
    until: float | None = None
    via: str | None = None


class ProviderHealth:
    """The health of one provider resource (see the module docstring)."""

    __slots__ = (
        "_state",
        "can_probe",
        "ejected_at",
        "ejected_until",
        "ejections",
        "ejections_total",
        "failures",
        "held_until",
        "last_failure",
        "last_probe_failed",
        "next_probe_at",
        "probes_failed",
        "probes_ok",
        "probing",
        "trial",
    )

    def __init__(self, can_probe: bool) -> None:
        self.can_probe = can_probe
        self._state = _State.UNKNOWN
        self.failures = 0
        self.ejections = 0
        self.ejected_at: float | None = None
        self.ejected_until: float | None = None
        self.held_until: float | None = None
        self.last_failure: str | None = None
        self.next_probe_at: float | None = None
        self.probing = False
        self.last_probe_failed = False
        #: the lease of the half-open trial request while it runs (the scheduler sets it)
        self.trial: object | None = None
        self.ejections_total = 0
        self.probes_ok = 0
        self.probes_failed = 0

    # -- what the scheduler reads ------------------------------------------------------------

    @property
    def health(self) -> Health:
        """``unknown``, ``healthy``, or ``unhealthy`` (ejected or half-open)."""
        state = self._state
        if state is _State.UNKNOWN:
            return Health.UNKNOWN
        return Health.HEALTHY if state is _State.HEALTHY else Health.UNHEALTHY

    @property
    def ejected(self) -> bool:
        """Ejected and not yet half-open."""
        return self._state is _State.EJECTED

    @property
    def half_open(self) -> bool:
        """The ejection ran out without a probe's verdict: one trial request may go."""
        return self._state is _State.HALF_OPEN

    @property
    def out(self) -> bool:
        """Ejected, or held by a 429: no new request goes here outside a panic."""
        return self._state is _State.EJECTED or self.held_until is not None

    @property
    def usable(self) -> bool:
        """Whether a new request may go here (outside a panic): not out, and no trial running."""
        return not self.out and not (self._state is _State.HALF_OPEN and self.trial is not None)

    def next_time(self) -> float | None:
        """When :meth:`advance` has something to do next, or ``None``."""
        times = [t for t in (self.ejected_until, self.held_until) if t is not None]
        if self.next_probe_at is not None and self.can_probe and not self.probing:
            times.append(self.next_probe_at)
        return min(times) if times else None

    # -- what happens to it ------------------------------------------------------------------

    def succeeded(
        self, now: float, *, probe: bool = False, started: float | None = None
    ) -> HealthEvent | None:
        """A request (or a probe) got an answer: healthy at once — unless the request
        ``started`` before the provider's latest ejection: an answer to a request sent before
        the failures that ejected it says nothing about it now, and changes nothing."""
        previous = self._state
        if (
            started is not None
            and self.ejected_at is not None
            and started < self.ejected_at
            and (previous is _State.EJECTED or previous is _State.HALF_OPEN)
        ):
            return None
        self.failures = 0
        self.trial = None
        if not probe:
            self.ejections = 0
        if previous is _State.HEALTHY:
            return None
        self._state = _State.HEALTHY
        self.ejected_until = None
        self.next_probe_at = None
        self.last_probe_failed = False
        if previous is _State.UNKNOWN:
            return None
        via = "probe" if probe else ("trial" if previous is _State.HALF_OPEN else "request")
        return HealthEvent("recovered", via=via)

    def failed(self, failure: Failure, now: float, policy: HealthPolicy) -> HealthEvent | None:
        """A request failed on this provider (see :data:`FailureKind`)."""
        self.last_failure = failure.reason
        if failure.kind == "status_429":
            if failure.retry_after is None or failure.retry_after <= 0:
                return None
            hold = min(failure.retry_after, policy.max_eject_ms / 1000.0)
            until = now + hold
            if self.held_until is not None and self.held_until >= until:
                return None
            self.held_until = until
            return HealthEvent("held", reason=failure.reason, until=until)
        self.failures += 1
        state = self._state
        if state is _State.HALF_OPEN or (
            state is not _State.EJECTED and self.failures >= policy.failure_threshold
        ):
            return self._eject(now, policy)
        return None

    def probed(
        self, ok: bool, reason: str | None, now: float, policy: HealthPolicy
    ) -> HealthEvent | None:
        """A probe came back. Success ends the ejection (or the half-open wait); a failure waits
        for the next one. A result nobody asked this state for (a probe started before the
        provider was disabled and enabled again: a new state) is ignored."""
        if not self.probing:
            return None
        self.probing = False
        if ok:
            self.probes_ok += 1
        else:
            self.probes_failed += 1
        state = self._state
        if ok and (state is _State.EJECTED or state is _State.HALF_OPEN):
            # Half-open too (the ejection ran out while the probe ran): healthy at once.
            return self.succeeded(now, probe=True)
        if state is not _State.EJECTED:
            return None  # recovered meanwhile, or a failure while half-open: the trial decides
        self.last_probe_failed = True
        if reason is not None:
            self.last_failure = reason
        self.next_probe_at = now + policy.probe_interval_ms / 1000.0
        return None

    def start_probe(self) -> None:
        """The scheduler asked for a probe: no other until it comes back."""
        self.probing = True

    def advance(self, now: float, policy: HealthPolicy) -> list[HealthEvent | Literal["probe"]]:
        """Everything due at ``now``: a hold ends, an ejection runs out, a probe is due."""
        done: list[HealthEvent | Literal["probe"]] = []
        if self.held_until is not None and self.held_until <= now:
            self.held_until = None
        if self._state is _State.EJECTED:
            assert self.ejected_until is not None
            if self.ejected_until <= now:
                if self.can_probe and self.last_probe_failed:
                    done.append(self._eject(now, policy))  # probes still fail: again, longer
                else:
                    self._state = _State.HALF_OPEN
                    self.ejected_until = None
                    self.next_probe_at = None
                    done.append(HealthEvent("half_open", failures=self.failures))
            if (
                self._state is _State.EJECTED
                and self.can_probe
                and not self.probing
                and self.next_probe_at is not None
                and self.next_probe_at <= now
            ):
                self.probing = True
                done.append("probe")
        return done

    def _eject(self, now: float, policy: HealthPolicy) -> HealthEvent:
        self.ejections += 1
        self.ejections_total += 1
        until = now + policy.ejection_s(self.ejections)
        self.ejected_at = now
        self._state = _State.EJECTED
        self.ejected_until = until
        self.trial = None
        self.last_probe_failed = False
        if self.can_probe:
            self.next_probe_at = now + policy.probe_interval_ms / 1000.0
        return HealthEvent("ejected", failures=self.failures, reason=self.last_failure, until=until)

    def __repr__(self) -> str:
        return (
            f"ProviderHealth({self._state.value} failures={self.failures} "
            f"ejections={self.ejections} until={self.ejected_until} held={self.held_until})"
        )
