"""The life of one ``iop-node`` process (:class:`NodeAgent`, design §2 and §6).

It dials the edge (:func:`iop_edge.node.dial.dial`: the upgrade with the node's token, ``HELLO``,
``WELCOME``, ``PAYLOAD``, ``ACK``) and serves the link's requests with a
:class:`~iop_edge.node.runner.LinkRunner` until the link ends; then it dials again, with
full-jitter backoff (reset once a link was acknowledged and stayed up for one heartbeat).

- ``GOAWAY{handover}`` (``iop-edge restart``): dial again at once (0–100 ms of jitter); the old
  link keeps serving its requests, on its own generation's adapters, until the old process
  closes it. ``GOAWAY{stopping}``: dial again with backoff, the old link serving meanwhile.
- SIGTERM or SIGINT: ``STOPPING``, ``GOAWAY{draining}`` on every link, the requests in flight
  finish for ``--drain-timeout`` seconds, the rest are cancelled; exit 0.
- A permanent refusal (:class:`~iop_edge.node.dial.Permanent`: HTTP 401, another protocol
  version; or ``REFUSED{superseded}`` on the current link: another agent holds the token)
  stops the dialing; the links still up drain as on SIGTERM; exit 2 (1: a payload that does
  not build). Everything else — an edge down, a TLS failure, a link broken by the edge — is
  retried.
- sd_notify: ``READY`` once the options are valid, ``STATUS`` as the link comes and goes,
  ``WATCHDOG`` from the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import random
import signal
import socket
import ssl as ssl_module
from collections.abc import Awaitable, Callable
from typing import Any, Final, Literal, TypeVar

import aiohttp

from iop_edge import __version__
from iop_edge.link.connection import LinkClosed
from iop_edge.link.handshake import Hello, parse_refused
from iop_edge.link.protocol import CLOSE_NORMAL, PROTOCOL_VERSION, Frame, Kind, LinkViolation
from iop_edge.node.backoff import Backoff
from iop_edge.node.dial import HANDSHAKE_TIMEOUT, Dialled, Permanent, Retry, dial
from iop_edge.node.generations import PayloadCache
from iop_edge.node.options import EXIT_DRAINED, EXIT_REFUSED, NodeOptions
from iop_edge.node.runner import LinkRunner
from iop_edge.runtime.clock import MonotonicClock
from iop_edge.runtime.logs import Logger, flush_logs
from iop_edge.runtime.systemd import Notifier
from iop_edge.seams import Clock

__all__ = ["HANDOVER_JITTER", "STATS_EVERY_HEARTBEATS", "NodeAgent"]

HANDOVER_JITTER: Final = 0.1
"""Seconds: the most a redial after ``GOAWAY{handover}`` waits (the nodes of an edge do not all
dial its new process in the same instant)."""
STATS_EVERY_HEARTBEATS: Final = 5
"""A ``STATS`` frame goes every this many heartbeats."""

_T = TypeVar("_T")
Redial = Literal["now", "backoff"]


class _Wake(enum.Enum):
    """Why a wait of the dial loop ended before its work did."""

    STOP = "stop"
    TIMEOUT = "timeout"


class _Session:
    """One acknowledged link and its runner; what it asks of the dial loop: ``redial`` (``now``
    after a handover, ``backoff`` once the link is gone or the edge stops) or ``refusal`` (a
    permanent one, heeded on the current link only)."""

    def __init__(self, agent: NodeAgent, dialled: Dialled) -> None:
        self._agent = agent
        self.link = dialled.link
        self.generation = dialled.generation
        self.node_id = dialled.welcome.node_id
        self.heartbeat = dialled.welcome.heartbeat_ms / 1000
        self.runner = LinkRunner(
            dialled.link,
            dialled.adapters,
            clock=agent.clock,
            log=agent.log,
            on_control=self._control,
        )
        self.redial: Redial | None = None
        self.refusal: str | None = None
        self.changed = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self._stats_timer: Callable[[], None] | None = None
        self._sending: set[asyncio.Future[None]] = set()

    def ask(self, *, redial: Redial | None = None, refusal: str | None = None) -> None:
        """Tell the dial loop what this link needs (the first ask of each kind stands)."""
        self.redial = self.redial or redial
        self.refusal = self.refusal or refusal
        self.changed.set()

    async def serve(self) -> None:
        """Serve the link until it ends; then its requests are cancelled (nobody can be
        answered) and its generation released."""
        log = self._agent.log
        self._arm_stats(self._agent.clock.now())
        try:
            await self.runner.serve()
        except LinkClosed as exc:
            log.info(
                "node_link_down",
                edge=self._agent.options.edge,
                code=exc.code,
                reason=exc.reason,
                closed_by="node" if exc.local else "edge",
                in_flight=self.runner.in_flight,
            )
        except LinkViolation as exc:
            log.warning(
                "node_link_violation",
                edge=self._agent.options.edge,
                reason=exc.reason,
                message=str(exc),
            )
        finally:
            if self._stats_timer is not None:
                self._stats_timer()
            await self.runner.aclose()
            await self._agent.cache.release(self.generation)
            self.ask(redial="backoff")

    async def _control(self, frame: Frame) -> None:
        """A frame of stream 0 the runner does not handle itself."""
        log = self._agent.log
        if frame.kind is Kind.GOAWAY:
            reason = frame.meta.get("reason")
            log.info("node_goaway", edge=self._agent.options.edge, reason=reason)
            self.ask(redial="now" if reason == "handover" else "backoff")
        elif frame.kind is Kind.REFUSED:
            refused = parse_refused(frame.meta)
            log.warning("node_link_refused", reason=refused.reason, message=refused.message)
            if refused.reason == "superseded":
                self.ask(
                    refusal=f"another iop-node connected to the edge with node "
                    f"{self.node_id!r}'s token and replaced this one ({refused.message})"
                )
            else:
                self.ask(redial="backoff")
        else:
            raise LinkViolation("phase", f"the edge sent {frame.kind.name} on a serving link")

    def _arm_stats(self, now: float) -> None:
        when = now + STATS_EVERY_HEARTBEATS * self.heartbeat

        def fire() -> None:
            if self.link.closed:
                return
            sending = asyncio.ensure_future(self._send_stats())
            self._sending.add(sending)
            sending.add_done_callback(self._sending.discard)
            self._arm_stats(when)

        self._stats_timer = self._agent.clock.call_at(when, fire)

    async def _send_stats(self) -> None:
        with contextlib.suppress(LinkClosed):
            await self.link.send(self.runner.stats_frame())


class NodeAgent:
    """One ``iop-node`` process: dial, serve, redial, drain (see the module docstring).

    ``clock`` bounds the handshake and times the heartbeats, the drain and the backoff;
    ``random`` draws the backoff's jitter; ``handle_signals`` installs the SIGTERM and SIGINT
    handlers (a test calls :meth:`stop` instead).
    """

    def __init__(
        self,
        options: NodeOptions,
        *,
        log: Logger,
        ssl: ssl_module.SSLContext | None = None,
        notifier: Notifier | None = None,
        clock: Clock | None = None,
        random: Callable[[], float] = random.random,
        handle_signals: bool = True,
    ) -> None:
        self.options = options
        self.log = log
        self.ssl = ssl
        self.notifier = notifier or Notifier()
        self.clock = clock or MonotonicClock()
        self.cache = PayloadCache(self.clock)
        self._random = random
        self._handle_signals = handle_signals
        self._stopping = asyncio.Event()
        self._sessions: set[_Session] = set()
        self.connected = asyncio.Event()
        """Set while the current link is acknowledged and up."""

    @property
    def links(self) -> int:
        """Links up now (the current one, and old ones finishing after a handover)."""
        return len(self._sessions)

    def stop(self) -> None:
        """Drain and exit 0, as SIGTERM does."""
        self._stopping.set()

    async def run(self) -> int:
        """Dial and serve until stopped or refused for good; return the exit code."""
        loop = asyncio.get_running_loop()
        if self._handle_signals:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self.stop)
        watchdog: asyncio.Task[None] | None = None
        try:
            self.log.info(
                "node_starting",
                edge=self.options.edge,
                ca_file=str(self.options.ca_file) if self.options.ca_file else None,
                drain_timeout=self.options.drain_timeout,
                agent_version=__version__,
                protocol=PROTOCOL_VERSION,
                hostname=socket.gethostname(),
                pid=os.getpid(),
            )
            if self.notifier.watchdog_interval:
                watchdog = asyncio.create_task(self._watchdog(self.notifier.watchdog_interval))
            self.notifier.ready(f"dialing {self.options.edge}")
            timeout = aiohttp.ClientTimeout(total=None, connect=HANDSHAKE_TIMEOUT)
            async with aiohttp.ClientSession(timeout=timeout) as http:
                code = await self._dial_loop(http)
                self.notifier.stopping("draining" if code == EXIT_DRAINED else "refused")
                drained = await self._drain()
            await self.cache.aclose()
            self.log.info("node_stopped", exit_code=code, drained=drained)
            return code
        finally:
            if watchdog is not None:
                watchdog.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watchdog
            if self._handle_signals:
                for signum in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(signum)
            self.notifier.close()
            flush_logs()

    # -- dialing -------------------------------------------------------------------------------

    async def _dial_loop(self, http: aiohttp.ClientSession) -> int:
        """Keep one acknowledged link up; the exit code once stopped or refused for good."""
        backoff = Backoff(random=self._random)
        delay = 0.0
        while True:
            if delay and await self._race(self._stopping.wait(), delay) is _Wake.STOP:
                return EXIT_DRAINED
            hello = Hello(
                protocol=PROTOCOL_VERSION,
                agent=__version__,
                hostname=socket.gethostname(),
                pid=os.getpid(),
                have=self.cache.generations,
            )
            work = dial(http, self.options, hello, self.cache, clock=self.clock, ssl=self.ssl)
            try:
                dialled = await self._race(work, HANDSHAKE_TIMEOUT)
            except Permanent as exc:
                self.log.error("node_refused", edge=self.options.edge, message=str(exc))
                return exc.exit_code
            except Retry as exc:
                delay = self._failed(backoff, str(exc))
                continue
            if dialled is _Wake.STOP:
                return EXIT_DRAINED
            if dialled is _Wake.TIMEOUT:
                delay = self._failed(backoff, f"no handshake within {HANDSHAKE_TIMEOUT:g} s")
                continue
            session = self._serve(dialled, backoff)
            if await self._race(session.changed.wait(), None) is _Wake.STOP:
                return EXIT_DRAINED
            self.connected.clear()
            if session.refusal is not None:
                self.log.error("node_refused", edge=self.options.edge, message=session.refusal)
                return EXIT_REFUSED
            if session.redial == "now":
                delay = self._random() * HANDOVER_JITTER
            else:
                delay = backoff.next_delay()
            self.notifier.status(f"the link to {self.options.edge} ended; dialing again")

    def _failed(self, backoff: Backoff, error: str) -> float:
        """Log a failed dial; the delay before the next."""
        delay = backoff.next_delay()
        self.log.warning(
            "node_link_failed",
            edge=self.options.edge,
            error=error,
            retry_in=round(delay, 3),
            attempt=backoff.attempts,
        )
        self.notifier.status(f"cannot reach {self.options.edge}: {error}; retrying")
        return delay

    def _serve(self, dialled: Dialled, backoff: Backoff) -> _Session:
        """Start serving an acknowledged link."""
        session = _Session(self, dialled)
        self._sessions.add(session)
        session.task = asyncio.create_task(session.serve(), name="iop-node link")
        session.task.add_done_callback(lambda _: self._sessions.discard(session))
        welcome = dialled.welcome
        dialled.link.start_heartbeats(welcome.heartbeat_ms)
        # The backoff starts again from its base once this link has stayed up a heartbeat.
        self.clock.call_at(
            self.clock.now() + session.heartbeat,
            lambda: None if session.changed.is_set() else backoff.reset(),
        )
        self.connected.set()
        self.log.info(
            "node_connected",
            edge=self.options.edge,
            edge_id=welcome.edge_id,
            edge_version=welcome.edge_version,
            node_id=welcome.node_id,
            generation=dialled.generation,
            heartbeat_ms=welcome.heartbeat_ms,
        )
        self.notifier.status(
            f"connected to {self.options.edge} as node {welcome.node_id} "
            f"(payload {dialled.generation})"
        )
        return session

    async def _race(self, work: Awaitable[_T], timeout: float | None) -> _T | _Wake:
        """``work``'s result, unless the stop comes first (:attr:`_Wake.STOP`) or ``timeout``
        seconds pass on the clock (:attr:`_Wake.TIMEOUT`): ``work`` is then cancelled."""
        task = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(self._stopping.wait())
        waits: set[asyncio.Future[Any]] = {task, stop}
        timed_out = asyncio.Event()
        cancel_timer: Callable[[], None] | None = None
        if timeout is not None:
            cancel_timer = self.clock.call_at(self.clock.now() + timeout, timed_out.set)
            waits.add(asyncio.ensure_future(timed_out.wait()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if cancel_timer is not None:
                cancel_timer()
            for waiting in waits - {task}:
                waiting.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Permanent, Retry):
            await task
        return _Wake.STOP if self._stopping.is_set() else _Wake.TIMEOUT

    # -- stopping ------------------------------------------------------------------------------

    async def _drain(self) -> bool:
        """Tell every link the node drains, let their requests finish until the drain
        timeout, cancel the rest, close the links. True when none had to be cancelled."""
        sessions = list(self._sessions)
        for session in sessions:
            with contextlib.suppress(LinkClosed):
                await session.link.send(Frame(Kind.GOAWAY, meta={"reason": "draining"}))
        in_flight = sum(s.runner.in_flight for s in sessions)
        self.log.info("node_draining", links=len(sessions), in_flight=in_flight)
        until = self.clock.now() + self.options.drain_timeout
        finished = await asyncio.gather(*(s.runner.drain(until) for s in sessions))
        for session in sessions:
            await session.link.close(CLOSE_NORMAL, "drained")
        for session in sessions:
            if session.task is not None:
                await session.task
        return all(finished)

    async def _watchdog(self, interval: float) -> None:
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(interval)
