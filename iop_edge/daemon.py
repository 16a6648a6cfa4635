"""Wiring and lifecycle of ``iop-edge serve``.

Start: build the scheduler, the adapters (a remote node's: its
:class:`~iop_edge.link.remote.RemoteNode`, reached over its link) and the OpenAI surface from
the config; bind the OpenAI, metrics and console listeners, and the node listener
(``listen.address``, :class:`~iop_edge.link.edge_server.NodeLinkServer`) when a node is
remote; start the supervisor (file watch, SIGHUP, admin refresh); tell systemd ``READY=1``.
Stop (SIGTERM/SIGINT), all within ``drain_timeout`` seconds of the signal: ``STOPPING=1``, stop
accepting (new node links too: ``GOAWAY{stopping}``), let requests in flight and in the queue
finish until the cancellation reserve (:func:`cancel_reserve`) before the end, cancel the rest
(leases are released, upstream calls aborted, CLI process groups killed), close the node links
and upstream connections, exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import secrets
import signal
import socket
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from iop_edge import __version__
from iop_edge.adapters.cli_process import KILL_GRACE_SECONDS
from iop_edge.adapters.registry import NodeAdapters
from iop_edge.admission import AdmissionScheduler, MonotonicClock
from iop_edge.api.admin import AdminAPI
from iop_edge.api.catalog import build_catalog
from iop_edge.api.guard import RequestGuard
from iop_edge.api.server import OpenAIServer
from iop_edge.collectors import ResponsesStoreCollector
from iop_edge.config.payload import NodeConfigPayload, payload_generation
from iop_edge.config.policy import pool_policy
from iop_edge.config.schema import EdgeConfig
from iop_edge.config.validate import config_warnings, is_loopback
from iop_edge.envelope import envelope
from iop_edge.errors import RequestError
from iop_edge.handover.coordinator import HandoverCoordinator
from iop_edge.handover.relay import HandoverRelay
from iop_edge.handover.result import HandedOver
from iop_edge.link.edge_server import NodeLinkServer, ssl_context
from iop_edge.link.remote import RemoteNode
from iop_edge.link.statistics import NodeLinkStatistics
from iop_edge.metrics import EdgeMetrics
from iop_edge.options import ServeOptions
from iop_edge.pool import HealthEvent, PoolPolicy, ProviderKey
from iop_edge.runtime import signals
from iop_edge.runtime.lifecycle import Lifecycle, Phase
from iop_edge.runtime.listeners import (
    ADMIN_MAX_CONNECTIONS,
    ConnectionLimits,
    FdLimit,
    Listener,
    raise_fd_limit,
)
from iop_edge.runtime.logs import Logger, RequestLineWriter, flush_logs, get_logger
from iop_edge.runtime.systemd import Notifier
from iop_edge.runtime_record import remove_record, write_record
from iop_edge.seams import Clock
from iop_edge.shared.gate import SharedGate
from iop_edge.shared.store import SharedStore
from iop_edge.supervisor import Supervisor, status_line

GC_THRESHOLDS: Final = (50_000, 20, 20)
"""The collector's thresholds in ``serve`` (Python's are 700, 10, 10). Requests free their
objects by reference counting; the collector only walks what is still alive, so young
collections cost the same whichever the threshold, and are 70 times fewer. Fewer of them also
promote fewer objects of requests in flight to the old generation, whose full collections walk
every long-lived object — with 10,000 requests waiting, 160–290 ms each, 26 times in a
benchmark run, which was the tail at concurrency 64 (issue 16; ``bench/proxy_bench.py
--scaling-only``). Cyclic garbage waits for up to 50,000 allocations."""


def cancel_reserve(drain_timeout: float) -> float:
    """The end of a drain kept for cancelling what is still running: a quarter of the drain
    timeout, at most 2.5 s — the CLI kill grace (SIGTERM, then SIGKILL 2 s later to a group
    that lingers) and half a second to spare."""
    return min(drain_timeout / 4, KILL_GRACE_SECONDS + 0.5)


@dataclass
class Daemon:
    """The running edge: scheduler, adapters, listeners, supervisor, metrics, sd_notify.

    ``config`` and ``options`` say what to run (:mod:`iop_edge.options`); the other fields
    given are live objects the daemon uses (a test injects its clock or notifier), and those
    built here are the running process.
    """

    config: EdgeConfig
    options: ServeOptions = field(default_factory=ServeOptions)
    clock: Clock = field(default_factory=MonotonicClock)
    log: Logger = field(default_factory=get_logger)
    #: how request lines are written (``serve`` passes the fast JSON writer of its log setup)
    write_request_line: RequestLineWriter | None = None
    #: systemd's notification socket; silenced once a handover passed it to the new process
    notifier: Notifier = field(default_factory=Notifier)
    #: listening sockets passed in, by listener name (:mod:`iop_edge.runtime.activation`): used
    #: instead of binding that listener's configured address
    inherited: dict[str, socket.socket] = field(default_factory=dict)
    #: where this process is in its life (:mod:`iop_edge.runtime.lifecycle`): the daemon and its
    #: handover move it, the server reads it
    lifecycle: Lifecycle = field(default_factory=Lifecycle, init=False)
    #: the handover, either side of it (:mod:`iop_edge.handover`), and its relay
    handover: HandoverCoordinator = field(init=False)
    relay: HandoverRelay = field(init=False)
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    scheduler: AdmissionScheduler = field(init=False)
    adapters: NodeAdapters = field(init=False)
    #: the node listener's links, when a node is remote (``config.node_listener_enabled``)
    node_links: NodeLinkServer | None = field(default=None, init=False)
    server: OpenAIServer = field(init=False)
    metrics: EdgeMetrics = field(init=False)
    #: the reload path; without a config file (``options.config_path``) it holds the config
    #: given, fixed (:class:`~iop_edge.config_source.FixedConfigSource`)
    supervisor: Supervisor = field(init=False)
    listeners: dict[str, Listener] = field(default_factory=dict, init=False)
    stopped: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list, init=False)
    #: where the console's address is recorded for the command line (:mod:`runtime_record`)
    _console_record: Path | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        options = self.options
        remote_nodes: dict[str, RemoteNode] = {}

        def remote(payload: NodeConfigPayload) -> RemoteNode:
            node = remote_nodes[payload.node_id] = RemoteNode(
                payload,
                clock=self.clock,
                heartbeat_ms=self.config.bootstrap.heartbeat_ms,
                generation=payload_generation(payload),
                on_state=self._node_link_state,
                log=self.log,
            )
            return node

        self.adapters = NodeAdapters.from_config(self.config, self.clock, remote=remote)
        if self.config.node_listener_enabled:
            self.node_links = NodeLinkServer.from_config(
                self.config, remote_nodes, edge_version=__version__, clock=self.clock, log=self.log
            )
        policy = pool_policy(self.config)
        self.scheduler = AdmissionScheduler(
            policy,
            clock=self.clock,
            prober=self.adapters.probe,
            on_health=self._log_health,
            gate=shared_gate(self.config, policy, self.clock, self.log),
        )
        self.relay = HandoverRelay(self.clock)
        self.handover = HandoverCoordinator(
            self.config,
            self.scheduler,
            self.listeners,
            self.lifecycle,
            self.relay,
            options,
            clock=self.clock,
            log=self.log,
            on_handed_over=self._handed_over,
            on_idle=self.stopped.set,
            on_stop_listening=self._nodes_dial_again,
        )
        supervisor = self.supervisor = Supervisor(
            options.config_path,
            self.config,
            apply=self.apply_config,
            env=options.env,
            log=self.log,
            options=options.supervisor_options,
            notifier=self.notifier,
        )
        self.metrics = EdgeMetrics(
            self.registry,
            self.scheduler.statistics,
            lambda: supervisor,
            lambda: [listener.statistics() for listener in self.listeners.values()],
            self.handover.statistics,
            config=self.config,
            nodes=None if self.node_links is None else self.node_links.statistics,
            node_refusals=lambda: self.node_links.refused if self.node_links else {},
            shared=None if self.scheduler.gate is None else self.scheduler.gate.statistics,
        )
        self.server = OpenAIServer(
            self.config,
            self.scheduler,
            self.adapters,
            clock=self.clock,
            logger=self.log,
            write_request_line=self.write_request_line,
            observers=[self.metrics.observe_request, self.handover.observe],
            lifecycle=self.lifecycle,
            relay=self.relay,
        )
        self.registry.register(ResponsesStoreCollector(self.server.responses_store.statistics))
        supervisor.add_listener(self.metrics.observe_refresh)

    def apply_config(self, config: EdgeConfig) -> None:
        """Swap the live part of ``config`` in: scheduler policy and catalog in one loop step
        (both are built before either is swapped, so a failure changes nothing)."""
        policy = pool_policy(config)
        catalog = build_catalog(config, created=self.server.load_times)
        self.scheduler.apply_policy(policy)
        self.server.swap_catalog(catalog)

    def _node_link_state(self, node_id: str, connected: bool) -> None:
        """A remote node's link came up or went down: its providers join or leave the pool
        (the link's only write into admission)."""
        self.scheduler.set_connected(node_id, connected)

    def node_statistics(self) -> tuple[NodeLinkStatistics, ...]:
        """Every node this process serves, in config order: a remote node's link as the node
        listener sees it, a local node as always connected (it has no link)."""
        links = self.node_links
        remote = {} if links is None else {s.node_id: s for s in links.statistics()}
        return tuple(
            remote.get(n.id) or NodeLinkStatistics(n.id, remote=False, connected=True)
            for n in self.config.nodes
        )

    def _nodes_dial_again(self) -> None:
        """This process stopped listening for its successor: the nodes dial the new one
        (``GOAWAY{handover}``); their links here serve until idle."""
        if self.node_links is not None:
            self.node_links.go_away("handover")

    def _log_health(self, subject: ProviderKey | str, event: HealthEvent) -> None:
        """One log line per health event (SPEC §5.1): ejections, recoveries, panics."""
        if isinstance(subject, str):
            if event.kind == "panic":
                self.log.warning(
                    "model_panic",
                    model=subject,
                    message="every enabled provider of this model group is out (ejected, or held "
                    "by a 429): health is ignored for it (requests go to all of them) until one "
                    "is back",
                )
            else:
                self.log.info("model_panic_over", model=subject)
            return
        node, provider = subject
        left = None if event.until is None else round(event.until - self.clock.now(), 3)
        if event.kind == "ejected":
            trusted = event.probes_trusted
            if trusted is None:
                message = (
                    f"no health check: ejected for the full {left:g} s, then one trial request"
                )
            elif trusted:
                message = f"ejected for up to {left:g} s: a passing health check ends it early"
            else:
                message = (
                    f"probes pass but requests fail: ejected for the full {left:g} s, then one "
                    "trial request"
                )
            self.log.warning(
                "provider_ejected",
                node=node,
                provider=provider,
                consecutive_failures=event.failures,
                reason=event.reason,
                ejected_for_s=left,
                probes_trusted=trusted,
                message=message,
            )
        elif event.kind == "held":  # an upstream failure (a 429): a warning, like an ejection
            self.log.warning(
                "provider_held", node=node, provider=provider, held_for_s=left, reason=event.reason
            )
        elif event.kind == "half_open":
            self.log.info(
                "provider_half_open",
                node=node,
                provider=provider,
                message="the ejection ran out with no probe verdict: the next request is a trial",
            )
        elif event.kind == "disconnected":  # its remote node's link went down
            self.log.warning(
                "provider_disconnected",
                node=node,
                provider=provider,
                message="the node's link is down: no candidate (requests wait in the queue or go "
                "to other providers) until the node dials in again",
            )
        elif event.kind == "connected":
            self.log.info("provider_connected", node=node, provider=provider)
        else:
            self.log.info("provider_recovered", node=node, provider=provider, via=event.via)

    # -- addresses ---------------------------------------------------------------------------

    @property
    def openai_url(self) -> str:
        """Base URL of the OpenAI surface, ``http://host:port/v1``."""
        return self.listeners["openai"].url + "/v1"

    @property
    def console_url(self) -> str:
        """Base URL of the admin API."""
        return self.listeners["console"].url

    @property
    def metrics_url(self) -> str:
        """URL of ``/metrics``."""
        return self.listeners["metrics"].url + "/metrics"

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind the listeners and start the supervisor; the edge is ready once this returns."""
        config = self.config
        if self.server.auth.open:
            self.log.warning(
                "anonymous_access",
                listen=config.openai.listen,
                message="openai.principal_tokens is empty: every request is accepted as "
                "'anonymous'" + ("" if is_loopback(config.openai.listen) else " (allow_anonymous)"),
            )
        if config.metrics.enabled and not is_loopback(config.metrics.listen):
            self.log.warning(
                "metrics_not_loopback",
                listen=config.metrics.listen,
                message="metrics.listen is not a loopback address: /metrics has no "
                "authentication, and anyone who reaches it sees model, provider and token_ref "
                "names and the traffic; firewall it or listen on 127.0.0.1",
            )
        limits = ConnectionLimits.from_config(config.openai)
        # The admin listeners share the OpenAI listener's timeouts, with a small cap of their
        # own, at which they evict an idle or incomplete connection: the operator gets in.
        admin_limits = dataclasses.replace(
            limits, max_connections=ADMIN_MAX_CONNECTIONS, evict_idle=True
        )
        await self._bind("openai", self.server.build_app(), config.openai.listen, limits)
        if config.metrics.enabled:
            await self._bind("metrics", self._metrics_app(), config.metrics.listen, admin_limits)
        # The console is bound only with a config file, as before every daemon had a
        # supervisor: the command line finds a daemon by its file (the runtime record,
        # console.listen), a refresh without a file could only find the config given
        # unchanged, and a daemon built without one (embedded use, tests) would take the
        # default address, 127.0.0.1:7601.
        if config.console.enabled and self.options.config_path is not None:
            admin = AdminAPI(
                config.edge.id,
                self.supervisor,
                self.scheduler,
                clock=self.clock,
                restart=self.handover.restart,
                handover=self.handover.statistics,
                nodes=self.node_statistics,
            )
            await self._bind("console", admin.build_app(), config.console.listen, admin_limits)
        if self.node_links is not None:
            # Serving at once, even while taking over: a link takes no lease, and the nodes
            # must find the new process as soon as the old one tells them to dial.
            node_limits = dataclasses.replace(
                admin_limits, max_connections=4 * len(self.node_links.nodes) + 16, evict_idle=False
            )
            tls = config.listen.tls
            await self._bind(
                "nodes",
                self.node_links.build_app(),
                config.listen.address,
                node_limits,
                serve=True,
                ssl_context=None if tls is None else ssl_context(tls),
            )
        if self.options.handover_fd is not None:
            # Taking over: count the old process's leases before accepting anything.
            await self.handover.take_over(self.options.handover_fd, self.listeners["openai"].url)
            for listener in self.listeners.values():
                await listener.start_serving()
        for name, unused in self.inherited.items():
            self.log.warning(
                "listener_socket_unused",
                listener=name,
                message=f"a socket was passed in for the {name} listener, which this config "
                "does not enable; it is closed",
            )
            unused.close()
        self.inherited.clear()
        self.supervisor.start(watch=self.options.watches(config))
        if self.notifier.watchdog_interval:
            self._tasks.append(asyncio.create_task(self._watchdog(self.notifier.watchdog_interval)))
        if self.options.freeze_gc:
            # Everything built so far lives as long as the process: move it out of the
            # collector's reach, so full collections walk only what requests allocate.
            gc.collect()
            gc.freeze()
            gc.set_threshold(*GC_THRESHOLDS)
        self.scheduler.start()  # idle providers are probed from now on
        if self.scheduler.gate is not None:
            await self.scheduler.gate.start()  # (the store down: its static split rules)
        self.lifecycle.enter(Phase.READY)
        self.notifier.ready(status_line(self.supervisor))
        self.handover.serving()
        self._record_console()
        self.log.info(
            "listening",
            edge=config.edge.id,
            config_watch=self.supervisor.watching,
            **{name: listener.url for name, listener in self.listeners.items()},
        )
        for problem in config_warnings(config):
            self.log.warning("config_warning", path=problem.path, message=problem.message)

    def _record_console(self) -> None:
        """Tell the command line where this daemon's admin API is (never fatal)."""
        console = self.listeners.get("console")
        config_path = self.options.config_path
        if console is None or config_path is None:
            return
        try:
            self._console_record = write_record(config_path, console.url, self.options.env)
        except OSError as exc:
            self.log.warning(
                "console_not_recorded",
                error=str(exc),
                message="iop-edge status, restart and config refresh find this daemon only "
                "through console.listen of its config file (or --console)",
            )

    async def _bind(
        self,
        name: str,
        app: web.Application,
        address: str,
        limits: ConnectionLimits,
        *,
        serve: bool | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        sock = self.inherited.pop(name, None)
        self.listeners[name] = listener = await Listener.bind(
            name,
            app,
            address,
            limits,
            clock=self.clock,
            log=self.log,
            sock=sock,
            # a successor accepts once it counted old's leases
            serve=self.options.handover_fd is None if serve is None else serve,
            ssl_context=ssl_context,
        )
        if sock is not None:
            self.log.info(
                "listener_inherited",
                listener=name,
                address=listener.url,
                configured=address,
                message=f"serving {name} on the socket passed in ({listener.url}); its "
                "configured address is not bound",
            )

    async def stop(self) -> None:
        """Drain and stop, all within ``drain_timeout`` seconds: stop accepting, let work in
        flight and in the queue finish until :func:`cancel_reserve` before the end, cancel the
        rest, close the upstream connections.

        The console and metrics listeners keep answering during the drain (status and scrapes
        show it) and close once the OpenAI listener is done.
        """
        loop = asyncio.get_running_loop()
        drain_timeout = self.options.drain_timeout
        deadline = loop.time() + drain_timeout
        cut_at = deadline - cancel_reserve(drain_timeout)
        if self.lifecycle.enter(Phase.STOPPING) is Phase.HANDING_OVER:
            self.handover.cancel()
        self.notifier.stopping()
        openai = self.listeners.pop("openai", None)
        if openai is not None:
            openai.stop_accepting()
        nodes = self.listeners.get("nodes")
        if nodes is not None and self.node_links is not None:
            # No new links; those up carry the remote requests of the drain, then close.
            nodes.stop_listening()
            self.node_links.go_away("stopping")
        stats = self.scheduler.statistics()
        self.log.info(
            "draining",
            in_flight=stats.in_flight,
            queued=stats.queue_depth,
            timeout_s=drain_timeout,
        )
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(cut_at):
                await self.supervisor.stop()
        if openai is not None:
            await self.handover.drain(openai, cut_at, deadline)
        if self.node_links is not None:
            await self.node_links.close()  # (the nodes listener's handlers then end)
        for listener in self.listeners.values():
            listener.stop_accepting()
        for listener in self.listeners.values():
            await self.handover.drain(listener, deadline, deadline)
        self.listeners.clear()
        # CLI process groups cancelled at the cut get SIGTERM, and SIGKILL after the grace if
        # they linger: waiting for that may pass the deadline when the drain is shorter than
        # four graces, never by more than one.
        await self.scheduler.aclose()
        if self.scheduler.gate is not None:
            await self.scheduler.gate.aclose()  # (the last releases sent; the members left)
        await self.relay.aclose()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(max(deadline, loop.time() + KILL_GRACE_SECONDS + 0.5)):
                await self.adapters.aclose()
        for task in self._tasks:  # the watchdog pings until the very end
            task.cancel()
        await self.handover.aclose()
        if self._console_record is not None:
            with contextlib.suppress(OSError):
                remove_record(self._console_record)
        stats = self.scheduler.statistics()
        self.log.info("stopped", in_flight=stats.in_flight, queued=stats.queue_depth)
        self.notifier.close()
        flush_logs()

    def _handed_over(self, pid: int) -> None:
        """The new process of a handover serves: it is systemd's (or the thin parent's) main
        process from now on, and speaks to it; this one falls silent."""
        self.notifier.notify(f"MAINPID={pid}")
        self.notifier.close()
        self.notifier = Notifier({})

    async def run(self, *, early_signals: Sequence[int] = ()) -> int:
        """Serve until SIGTERM or SIGINT, then drain and stop; returns the exit code.

        SIGHUP asks the supervisor for a refresh, SIGUSR2 for a restart. ``early_signals``
        holds those that arrived before the loop's handlers were installed
        (:mod:`iop_edge.runtime.signals`): a SIGHUP among them queues one refresh once started; a
        SIGUSR2 is logged and ignored (the process runs what it has just loaded). The soft
        open-file limit is raised to the hard one first.
        """
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stopped.set)
        loop.add_signal_handler(signal.SIGHUP, self._on_hup)
        loop.add_signal_handler(signal.SIGUSR2, self._on_usr2)
        try:
            self._log_fd_limit(raise_fd_limit())
            await self.start()
            # (read after the loop's handlers went in: none is lost)
            if signal.SIGHUP in early_signals:
                self._on_hup()
            if signal.SIGUSR2 in early_signals:
                self._restart_signal_ignored(Phase.STARTING)
            await self.stopped.wait()
        finally:
            await self.stop()
            signals.hand_back(loop)
        return 0

    def _log_fd_limit(self, limit: FdLimit) -> None:
        config = self.config
        caps = config.openai.max_connections + ADMIN_MAX_CONNECTIONS * 2
        self.log.info("fd_limit", soft_before=limit.soft_before, soft=limit.soft, hard=limit.hard)
        # Each connection is a descriptor; requests add upstream sockets and CLI pipes.
        if caps * 2 > limit.soft:
            self.log.warning(
                "fd_limit_low",
                soft=limit.soft,
                max_connections=config.openai.max_connections,
                message=f"the open-file limit {limit.soft} is below twice the listeners' "
                f"connection caps ({caps}): under load new connections may be reset before "
                "the caps refuse them; raise LimitNOFILE or lower openai.max_connections",
            )

    def _on_usr2(self) -> None:
        """SIGUSR2: hand over to a new process (as ``iop-edge restart``) — when ready; in any
        other phase it is logged and ignored (a stop never becomes a restart)."""
        if self.lifecycle.phase is not Phase.READY:
            self._restart_signal_ignored(self.lifecycle.phase)
            return

        async def restart() -> None:
            result = await self.handover.restart()
            if not isinstance(result, HandedOver):
                self.log.warning("restart_refused", **result.to_json())

        self._tasks.append(asyncio.create_task(restart()))

    def _restart_signal_ignored(self, phase: Phase) -> None:
        if phase is Phase.STARTING:
            message = signals.RESTART_SIGNAL_WHILE_STARTING
        else:
            message = f"a restart signal (SIGUSR2) is ignored: {Lifecycle.refusal_in(phase)}"
        self.log.warning(
            "restart_signal_ignored", signal="SIGUSR2", phase=phase.value, message=message
        )

    def _on_hup(self) -> None:
        # Without a config file too: the refresh finds the config given unchanged.
        self.supervisor.request("signal")

    async def _watchdog(self, interval: float) -> None:
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(interval)

    def _metrics_app(self) -> web.Application:
        # prometheus-client's own handler: content negotiation (OpenMetrics) and name[]
        # filters, nothing hand-written to keep in step with the exposition formats. No gzip:
        # aiohttp compresses in the loop's thread pool, and a scrape must answer even when
        # that pool is exhausted (the moment an operator looks).
        # The console's browser rules (a page could read token refs, models and traffic
        # through DNS rebinding): no Origin at all; on loopback, loopback Host names only. Off
        # loopback the operator chose the network (metrics_not_loopback warns at start).
        listen = self.config.metrics.listen
        guard = RequestGuard(
            allowed_origins=(),
            loopback_hosts_only=is_loopback(listen),
            no_origin="/metrics answers no web page (a scraper sends no Origin header).",
            why_loopback=f"metrics.listen is the loopback address {listen}; a scraper on this "
            "machine asks for it by one of those names.",
        )

        @web.middleware
        async def checks(request: web.Request, handler: Handler) -> web.StreamResponse:
            try:
                guard.check(request.headers)
            except RequestError as exc:
                body = envelope(str(exc), exc.code, status=exc.status)
                return web.Response(body=body, status=exc.status, content_type="application/json")
            return await handler(request)

        app = web.Application(middlewares=[checks])
        app.router.add_get(
            "/metrics", make_aiohttp_handler(self.registry, disable_compression=True)
        )
        return app


def shared_gate(
    config: EdgeConfig, policy: PoolPolicy, clock: Clock, log: Logger
) -> SharedGate | None:
    """The shared store's gate of a pool shared by several edges (``provider_pool.shared``),
    under a new instance id; ``None`` for a pool of its own."""
    shared = config.provider_pool.shared
    if shared is None or policy.shared is None:
        return None
    store = SharedStore(shared.store, instance_id=secrets.token_hex(6))
    log.info("shared_pool", store=store.redacted_url, instance=store.instance_id)
    return SharedGate(store, policy.shared, clock, log=log)
