"""One provider's health as a sans-IO state machine (SPEC §5.1): times are passed in.

States, and what moves between them::

    unknown ──success──▶ healthy ◀──────────── success (a request, a probe, the trial)
       │                    │                          ▲
       └──── failure_threshold consecutive failures ───┼──▶ ejected (until T)
             (requests, or idle probes)                │      │  probes every probe_interval
                                      no health check, │      ▼  (with a health check)
                                  probes not trusted,  │   at T: the last probe failed → ejected
                                      or no probe came │         again, for twice as long
                                      back before T    │
                                                       └── half-open: one trial request;
                                                           its failure ejects again (doubled)

- A failure is counted only when it is the provider's (connect, dropped, timeout, 5xx, exit, a
  broken answer); a 429 holds the provider out for its ``Retry-After`` without counting toward
  ejection. A request's success resets the consecutive failures, ends an ejection at once and
  resets the doubling.
- **Probes.** A provider with a health check is probed every ``probe_interval`` while ejected,
  and while idle — unknown or healthy, no attempt in flight and none ended for
  ``probe_interval`` (the scheduler says when it is busy and when an attempt ended:
  :attr:`ProviderHealth.quiet_since`). An idle probe's failure counts toward
  ``failure_threshold`` like a request's (so a dead idle provider is ejected before a request
  reaches it); its success makes an ``unknown`` provider ``healthy`` and clears the failed
  probes, never the failed requests (a provider whose probes pass while its requests fail is
  still ejected). An ejected provider's probe success ends the ejection at once — while probes
  are **trusted**: once a provider that a probe recovered is ejected again by failed requests
  before any request succeeded, its probes pass but its requests fail, and a probe success no
  longer ends its ejection: the ejection (doubled each time) runs to its end, then one
  half-open trial request decides. A request's success restores the trust.
- ``out`` — ejected or held — providers are not dispatch candidates unless their model group is
  in panic (every enabled, connected member out); the scheduler decides that, this module only
  keeps one provider's state.
- **Disconnected** (a remote provider whose node link is down) is not a state of this machine
  but the scheduler's: it shows as the health ``disconnected``, and the provider's health
  starts over (:meth:`ProviderHealth.renewed`) when the link goes down and when it is back.

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
    """A provider's health as the status API shows it (``disabled`` and ``disconnected`` are
    the scheduler's: :mod:`iop_edge.pool.statistics`)."""

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
    ``reason``; ``probes_trusted``: whether a passing probe ends it early — ``None`` for a
    provider without a health check, ``False`` once its probes pass while its requests fail),
    ``recovered`` (``via`` is ``request``, ``probe`` or ``trial``), ``half_open`` (the ejection
    ran out: one trial request may go), ``held`` (a 429 holds it out ``until``),
    ``disconnected`` (a remote provider's node link went down: no candidate until it is back)
    and ``connected`` (the link is back: its health starts ``unknown``); for a model,
    ``panic`` (every connected member out: health is ignored) and ``panic_over``.
    """

    kind: Literal[
        "ejected",
        "recovered",
        "half_open",
        "held",
        "connected",
        "disconnected",
        "panic",
        "panic_over",
    ]
    failures: int = 0
    reason: str | None = None
    until: float | None = None
    via: str | None = None
    probes_trusted: bool | None = None


class ProviderHealth:
    """The health of one provider resource (see the module docstring)."""

    __slots__ = (
        "_probe_recovered",
        "_state",
        "can_probe",
        "ejected_at",
        "ejected_until",
        "ejections",
        "ejections_total",
        "failures",
        "held_until",
        "idle_probes",
        "last_failure",
        "last_probe_failed",
        "next_probe_at",
        "probe_failures",
        "probe_sent_at",
        "probes_failed",
        "probes_ok",
        "probes_trusted",
        "probing",
        "quiet_since",
        "trial",
    )

    def __init__(self, can_probe: bool) -> None:
        self.can_probe = can_probe
        self._state = _State.UNKNOWN
        #: consecutive failed requests, and failed idle probes (together toward the threshold)
        self.failures = 0
        self.probe_failures = 0
        self.ejections = 0
        self.ejected_at: float | None = None
        self.ejected_until: float | None = None
        self.held_until: float | None = None
        self.last_failure: str | None = None
        #: ejected: the next probe; unknown or healthy with ``idle_probes``: the next idle check
        self.next_probe_at: float | None = None
        self.probing = False
        self.probe_sent_at: float | None = None
        self.last_probe_failed = False
        #: whether a probe's success may end an ejection (see the module docstring)
        self.probes_trusted = True
        self._probe_recovered = False  # a probe ended the last ejection; no request since
        #: whether idle providers are probed (the scheduler turns it on once it is started)
        self.idle_probes = False
        #: when the latest attempt on it ended (the scheduler sets it: idle probes wait for it)
        self.quiet_since: float | None = None
        #: the lease of the half-open trial request while it runs (the scheduler sets it)
        self.trial: object | None = None
        self.ejections_total = 0
        self.probes_ok = 0
        self.probes_failed = 0

    def renewed(self) -> ProviderHealth:
        """A fresh ``unknown`` health for the same provider, for when what was known of it no
        longer holds (its node link went down, or came back): its health check, whether idle
        probes are on and its counters since start (ejections, probes) carry over, nothing
        else — no failures, ejection, hold, trial or running probe."""
        health = ProviderHealth(self.can_probe)
        health.idle_probes = self.idle_probes
        health.ejections_total = self.ejections_total
        health.probes_ok = self.probes_ok
        health.probes_failed = self.probes_failed
        return health

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

    @property
    def consecutive_failures(self) -> int:
        """Failed requests and failed idle probes since the last success."""
        return self.failures + self.probe_failures

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
        self.probe_failures = 0
        self.trial = None
        if not probe and self.ejections:
            # A real request answered: the doubling starts over, and probes are trusted again.
            self.ejections = 0
            self.probes_trusted = True
            self._probe_recovered = False
        if previous is _State.HEALTHY:
            return None
        self._state = _State.HEALTHY
        if previous is _State.UNKNOWN:
            return None
        self.ejected_until = None
        self.next_probe_at = None  # (idle checks start again: arm_idle)
        self.last_probe_failed = False
        self._probe_recovered = probe
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
            state is not _State.EJECTED
            and self.failures + self.probe_failures >= policy.failure_threshold
        ):
            if self._probe_recovered:
                # A probe said it was back, and requests failed again before one succeeded:
                # its probes pass but its requests fail. Probes no longer end its ejections.
                self.probes_trusted = False
            return self._eject(now, policy)
        return None

    def probed(
        self, ok: bool, reason: str | None, now: float, policy: HealthPolicy
    ) -> HealthEvent | None:
        """A probe came back (``reason`` says why it failed).

        Ejected (or half-open, when the ejection ran out while the probe ran): a trusted
        success ends it at once; otherwise the result only tells the ejection's end whether
        probes still fail. Unknown or healthy, an idle probe: see the module docstring. A
        result nobody asked this state for (a probe started before the provider was disabled
        and enabled again: a new state; one sent before the ejection it would end; without
        idle probes, one of an ejection a request ended meanwhile) changes nothing but the
        probe counts.
        """
        if not self.probing:
            return None
        self.probing = False
        if ok:
            self.probes_ok += 1
        else:
            self.probes_failed += 1
        state = self._state
        if state is _State.EJECTED or state is _State.HALF_OPEN:
            sent = self.probe_sent_at
            if sent is not None and self.ejected_at is not None and sent < self.ejected_at:
                return None  # an idle probe sent before the ejection: says nothing now
            if ok and self.probes_trusted:
                return self.succeeded(now, probe=True)
            if state is _State.HALF_OPEN:
                return None  # the trial decides
            self.last_probe_failed = not ok
            if reason is not None and not ok:
                self.last_failure = reason
            self.next_probe_at = now + policy.probe_interval_s
            return None
        if not self.idle_probes:
            return None  # an ejected provider's probe, answered after a request recovered it
        # An idle probe of an unknown or healthy provider.
        self.next_probe_at = now + policy.probe_interval_s
        if ok:
            self.probe_failures = 0
            self._state = _State.HEALTHY
            return None
        self.last_failure = reason
        self.probe_failures += 1
        if self.failures + self.probe_failures >= policy.failure_threshold:
            return self._eject(now, policy)
        return None

    def start_probe(self) -> None:
        """The scheduler asked for a probe: no other until it comes back."""
        self.probing = True

    def arm_idle(self, now: float, policy: HealthPolicy) -> bool:
        """Start idle checks (at ``now + probe_interval``) if they are on and none is armed:
        the scheduler calls it when it starts and after every change of state. Returns
        whether it armed one."""
        if (
            self.idle_probes
            and self.can_probe
            and self.next_probe_at is None
            and not self.probing
            and (self._state is _State.UNKNOWN or self._state is _State.HEALTHY)
        ):
            self.next_probe_at = now + policy.probe_interval_s
            return True
        return False

    def advance(
        self, now: float, policy: HealthPolicy, busy: bool = False
    ) -> list[HealthEvent | Literal["probe"]]:
        """Everything due at ``now``: a hold ends, an ejection runs out, a probe is due.
        ``busy``: an attempt is in flight on the provider (it is not idle)."""
        done: list[HealthEvent | Literal["probe"]] = []
        if self.held_until is not None and self.held_until <= now:
            self.held_until = None
        state = self._state
        if state is _State.EJECTED:
            assert self.ejected_until is not None
            if self.ejected_until <= now:
                if self.can_probe and self.last_probe_failed:
                    done.append(self._eject(now, policy))  # probes still fail: again, longer
                else:
                    self._state = _State.HALF_OPEN
                    self.ejected_until = None
                    self.next_probe_at = None
                    done.append(HealthEvent("half_open", failures=self.consecutive_failures))
            if self._state is _State.EJECTED and self._probe_due(now):
                done.append(self._send_probe(now))
        elif self.idle_probes and state is not _State.HALF_OPEN and self._probe_due(now):
            interval = policy.probe_interval_s
            quiet = self.quiet_since
            if busy or self.held_until is not None:
                self.next_probe_at = now + interval  # traffic (or a 429's hold): no probe
            elif quiet is not None and quiet + interval > now:
                self.next_probe_at = quiet + interval
            else:
                done.append(self._send_probe(now))
        return done

    def _probe_due(self, now: float) -> bool:
        at = self.next_probe_at
        return self.can_probe and not self.probing and at is not None and at <= now

    def _send_probe(self, now: float) -> Literal["probe"]:
        self.probing = True
        self.probe_sent_at = now
        return "probe"

    def _eject(self, now: float, policy: HealthPolicy) -> HealthEvent:
        self.ejections += 1
        self.ejections_total += 1
        until = now + policy.ejection_s(self.ejections)
        self.ejected_at = now
        self._state = _State.EJECTED
        self.ejected_until = until
        self.trial = None
        self.last_probe_failed = False
        self.next_probe_at = now + policy.probe_interval_s if self.can_probe else None
        return HealthEvent(
            "ejected",
            failures=self.consecutive_failures,
            reason=self.last_failure,
            until=until,
            probes_trusted=self.probes_trusted if self.can_probe else None,
        )

    def __repr__(self) -> str:
        return (
            f"ProviderHealth({self._state.value} failures={self.consecutive_failures} "
            f"ejections={self.ejections} until={self.ejected_until} held={self.held_until}"
            f"{'' if self.probes_trusted else ' probes_distrusted'})"
        )
