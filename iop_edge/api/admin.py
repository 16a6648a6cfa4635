"""The admin API on ``console.listen`` (loopback by default).

- ``GET /admin/status``: the running config (hash, generation, restart-pending paths, the last
  refresh) and the scheduler (queue depth, every provider's slots and health, each model
  group's panic flag, the principals, the counters), the serving process's ``pid``, the
  handover it took over by (``handover``, or ``null``) and every node (``nodes``: local, or
  remote with its link — connected since, peer, agent, payload generation acknowledged, in
  flight, round trip, bytes, the last time it went down and why) and, in a pool shared by
  several edges (``provider_pool.shared``), the store (``shared``: its URL with its
  credentials ``<redacted>``, this edge's instance id, the store's state and since when it is
  down, the members, the dispatches it refused, the leases lost, each provider's leases over
  every edge next to this edge's; ``null`` otherwise). Times are wall-clock ISO 8601 (UTC).
- ``POST /admin/config/refresh?mode=dry_run|apply``: read the config file and refresh; the
  answer is the refresh result (any other mode is ``rejected``). With a JSON body
  ``{"candidate": TEXT, "source": NAME}`` and ``mode=dry_run`` the candidate TEXT is judged
  against the running config instead (``iop-edge config refresh --candidate FILE``): the file
  is not read, nothing is applied. Without ``console.admin_token_sha256``, each ``${VAR}`` or
  ``${file:}`` of a candidate is a problem (the result is ``rejected``): a tokenless console
  is not a way to read the daemon's environment. No answer shows a value the daemon took from
  its environment or a file (``<redacted>``, whatever the field). A body with any other mode
  is 400 ``invalid_request_error`` (``param: mode``); a body over :data:`MAX_CANDIDATE_BODY`
  bytes is 413.
- ``POST /admin/restart``: hand over to a new process (:mod:`iop_edge.handover`); 409
  ``daemon_stopping`` once the daemon is stopping (a stop never becomes a restart).

Every request passes the same checks first (a middleware, so unknown paths too), each refusal
a JSON error in the OpenAI envelope: no browser origin at all (an ``Origin`` header → 403
``origin_not_allowed``); with ``console.admin_token_sha256``, ``Authorization: Bearer <admin
token>`` (401 ``invalid_admin_token``); without one, only loopback ``Host`` names (403
``host_not_allowed``: the console must then listen on loopback, and a browser page must not
reach it through DNS rebinding); a POST body declared JSON (415 ``unsupported_media_type``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler

from iop_edge.admission import AdmissionScheduler
from iop_edge.api.auth import AdminTokenCheck
from iop_edge.api.errors import describe
from iop_edge.api.guard import RequestGuard, install_log_scrubber, require_json_body
from iop_edge.config.redact import redact_store_url
from iop_edge.config.schema import ConsoleSection
from iop_edge.config_file import MAX_FILE_BYTES
from iop_edge.envelope import envelope
from iop_edge.errors import IopEdgeError, RequestError
from iop_edge.handover.channel import HandoverStatistics
from iop_edge.pool import ProviderStatistics
from iop_edge.seams import Clock
from iop_edge.supervisor import Supervisor

if TYPE_CHECKING:
    from iop_edge.handover.result import RestartResult
    from iop_edge.link.statistics import NodeLinkStatistics

_JSON = "application/json"
#: A node's fields that only a remote node's link fills (``null`` for a local node).
_LINK_FIELDS = (
    "connected_since",
    "peer",
    "agent_version",
    "protocol",
    "generation",
    "generation_acked",
    "in_flight",
    "reconnects",
    "rtt_ms",
    "bytes_sent",
    "bytes_received",
    "violations",
    "last_down",
)

#: The largest refresh request body: the largest config file, JSON-escaped (a newline or a
#: quote takes two bytes), and its name. The candidate itself is held to the file's limit.
MAX_CANDIDATE_BODY = 2 * MAX_FILE_BYTES + 64 * 1024
#: The longest ``source`` name of a candidate (it appears in error messages).
MAX_SOURCE_LENGTH = 1024
#: Why a candidate's references are not resolved by a console without an admin token.
NO_TOKEN_NO_EXPANSION = (
    "this console has no admin token (console.admin_token_sha256), so a candidate's "
    "variables and files are not read from the daemon's environment; set "
    "console.admin_token_sha256 (iop-edge token admin) and send the token, or judge the "
    "candidate offline: iop-edge config refresh --offline RUNNING.yaml --candidate FILE, in "
    "a shell that has the variables"
)


class AdminAPI:
    """Handlers of the admin listener.

    ``console`` is the section the listener was started with (restart-class: a refresh never
    changes it); by default the supervisor's running config's. ``nodes`` gives every node of
    the process, local ones included (``remote=False``); without it ``nodes`` is empty.
    """

    def __init__(
        self,
        edge_id: str,
        supervisor: Supervisor,
        scheduler: AdmissionScheduler,
        console: ConsoleSection | None = None,
        *,
        clock: Clock,
        restart: Callable[[], Awaitable[RestartResult]] | None = None,
        handover: Callable[[], HandoverStatistics | None] | None = None,
        nodes: Callable[[], Sequence[NodeLinkStatistics]] | None = None,
    ) -> None:
        self.edge_id = edge_id
        self.handover = handover
        self.nodes = nodes
        self.restart_edge = restart
        self.supervisor = supervisor
        self.scheduler = scheduler
        self.clock = clock
        section = console if console is not None else supervisor.running.console
        self.token = AdminTokenCheck(section)
        self.guard = RequestGuard(
            allowed_origins=(),
            loopback_hosts_only=not self.token.enabled,
            no_origin="the admin API answers no web page (use iop-edge status or curl).",
            why_loopback="console.admin_token_sha256 is not set; set it to reach the admin "
            "API by other names.",
        )

    def build_app(self) -> web.Application:
        """The aiohttp application of the console listener."""
        install_log_scrubber()
        app = web.Application(middlewares=[self._checks], client_max_size=MAX_CANDIDATE_BODY)
        app.router.add_get("/admin/status", self.status)
        app.router.add_post("/admin/config/refresh", self.refresh)
        if self.restart_edge is not None:
            app.router.add_post("/admin/restart", self.restart)
        return app

    @web.middleware
    async def _checks(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            self.guard.check(request.headers)
            self.token.check(request.headers.get("Authorization"))
            if request.method == "POST":
                require_json_body(request)
        except IopEdgeError as exc:
            return _refusal(exc)
        return await handler(request)

    def snapshot(self) -> dict[str, Any]:
        """Everything ``GET /admin/status`` returns."""
        stats = self.scheduler.statistics()
        return {
            "edge": self.edge_id,
            "pid": os.getpid(),
            "config": self.supervisor.statistics().as_status(),
            "queue": {
                "depth": stats.queue_depth,
                "max_queue": stats.max_queue,
                "queue_timeout_ms": stats.queue_timeout_ms,
            },
            "nodes": [self._node(n) for n in (self.nodes() if self.nodes else ())],
            "providers": [self._provider(p) for p in stats.providers],
            "models": [
                {
                    "id": g.group_id,
                    "providers": g.members,
                    "panic": g.panic,
                    "derived_from": g.derived_from,
                }
                for g in stats.groups
            ],
            "principals": [
                {
                    "principal": p.principal,
                    "weight": p.weight,
                    "max_in_flight": p.max_in_flight,
                    "max_queued": p.max_queued,
                    "max_requests_per_minute": p.max_requests_per_minute,
                    "in_flight": p.in_flight,
                    "in_flight_elsewhere": p.in_flight_elsewhere,
                    "queued": p.queued,
                    "rejected": dict(p.rejected),
                }
                for p in stats.principals
            ],
            "handover": self._handover(),
            "shared": self._shared(),
            "counters": {
                "submitted": stats.submitted,
                "admitted": stats.admitted,
                "released": stats.released,
                "inherited": stats.inherited,
                "double_releases": stats.double_releases,
                "failovers": stats.failovers,
                "rejected": dict(stats.rejected),
            },
        }

    def _handover(self) -> dict[str, Any] | None:
        """The handover this process took over by (``None``: it was started otherwise)."""
        taken = self.handover() if self.handover is not None else None
        if taken is None:
            return None
        return {
            "from_pid": taken.from_pid,
            "at": datetime.fromtimestamp(taken.at, UTC).isoformat(timespec="milliseconds"),
            "duration_ms": round(taken.duration * 1000, 1),
            "inherited_leases": taken.inherited_leases,
            "inherited_held": taken.inherited_held,
            "relayed_requests": taken.relayed_requests,
            "old_running": taken.old_running,
        }

    def _shared(self) -> dict[str, Any] | None:
        """The store of a pool shared by several edges (``None``: the pool is this edge's).
        A provider's ``held`` and ``long_held`` are the store's counts over every edge (as last
        seen: from before it went down while it is down), ``mine`` and ``long_mine`` this
        edge's leases in them."""
        gate = self.scheduler.gate
        if gate is None:
            return None
        shared = gate.statistics()
        calls = shared.store_calls
        # (the URL as the config shows it everywhere else: its credentials `<redacted>`)
        store = redact_store_url(shared.store)
        last_error = calls.last_error
        return {
            "instance_id": shared.instance_id,
            "store": store,
            "state": shared.state,
            "down_since": self._wall(shared.down_since),
            "last_error": None if last_error is None else last_error.replace(shared.store, store),
            "on_store_down": shared.on_store_down,
            "lease_ttl_ms": shared.lease_ttl_ms,
            "members": shared.members,
            "leases": shared.leases,
            "refused": shared.refused,
            "lost": shared.lost,
            "store_errors": sum(calls.errors.values()),
            "providers": [
                {
                    "node": p.node_id,
                    "id": p.provider_id,
                    "held": p.held,
                    "long_held": p.long_held,
                    "mine": p.mine,
                    "long_mine": p.long_mine,
                }
                for p in shared.providers
            ],
        }

    def _node(self, n: NodeLinkStatistics) -> dict[str, Any]:
        """One node: a local one is always connected and has no link (its link fields are
        ``null``)."""
        if not n.remote:
            return {"id": n.node_id, "kind": "local", "connected": True} | dict.fromkeys(
                _LINK_FIELDS
            )
        down = None
        if n.last_down_at is not None:
            down = {"at": self._wall(n.last_down_at), "reason": n.last_down_reason}
        return {
            "id": n.node_id,
            "kind": "remote",
            "connected": n.connected,
            "connected_since": self._wall(n.connected_since),
            "peer": n.peer,
            "agent_version": n.agent_version,
            "protocol": n.protocol,
            "generation": n.generation,
            "generation_acked": n.generation_acked,
            "in_flight": n.in_flight,
            "reconnects": n.reconnects,
            "rtt_ms": None if n.rtt is None else round(n.rtt * 1000, 3),
            "bytes_sent": n.bytes_sent,
            "bytes_received": n.bytes_received,
            "violations": n.violations,
            "last_down": down,
        }

    def _provider(self, p: ProviderStatistics) -> dict[str, Any]:
        return {
            "node": p.node_id,
            "id": p.provider_id,
            "status": p.status,
            "health": p.health,
            "enabled": p.enabled,
            "capacity": p.capacity,
            "long_context_capacity": p.long_context_capacity,
            "in_flight": p.in_flight,
            "long_in_flight": p.long_in_flight,
            "held_elsewhere": p.held_elsewhere,
            "long_held_elsewhere": p.long_held_elsewhere,
            "priority": p.priority,
            "consecutive_failures": p.consecutive_failures,
            "last_failure": p.last_failure,
            "ejected_until": self._wall(p.ejected_until),
            "half_open": p.half_open,
            "held_until": self._wall(p.held_until),
            "ejections": p.ejections,
            "probes": {"ok": p.probes_ok, "failed": p.probes_failed},
            "probes_trusted": p.probes_trusted,
        }

    def _wall(self, when: float | None) -> str | None:
        """A scheduler (monotonic) time as wall-clock ISO 8601, UTC, to the millisecond."""
        if when is None:
            return None
        wall = time.time() + (when - self.clock.now())
        return datetime.fromtimestamp(wall, UTC).isoformat(timespec="milliseconds")

    async def status(self, request: web.Request) -> web.Response:
        """``GET /admin/status``."""
        return web.Response(body=orjson.dumps(self.snapshot()), content_type=_JSON)

    async def restart(self, request: web.Request) -> web.Response:
        """``POST /admin/restart``: hand over to a new process (issue 14). The result says
        ``handed_over`` (with the new ``pid``), or ``rejected`` / ``failed`` and why (this
        process serves on), as a refresh's result does."""
        assert self.restart_edge is not None
        result = (await self.restart_edge()).to_json()
        if result.get("phase") == "stopping":
            return web.Response(
                body=envelope(result["message"], "daemon_stopping", status=409),
                status=409,
                content_type=_JSON,
            )
        response = web.Response(body=orjson.dumps(result), content_type=_JSON)
        if result["result"] == "handed_over":
            response.force_close()  # the next request goes to the new process
        return response

    async def refresh(self, request: web.Request) -> web.Response:
        """``POST /admin/config/refresh?mode=dry_run|apply`` (default ``dry_run``); with a
        candidate in the body, a dry run of it (see the module docstring)."""
        mode = request.query.get("mode", "dry_run")
        if not request.body_exists:
            result = await self.supervisor.refresh("api", mode)
        else:
            try:
                text, source = await _candidate(request, mode)
            except RequestError as exc:
                return _refusal(exc)
            # Without an admin token any local process may call this: a candidate must not be
            # a way to read the daemon's environment or files (even redacted, the sorted ids
            # and uniqueness rules would leak a value bit by bit). A token holder can restart
            # the daemon with any config anyway: for them, expansion with redaction is enough.
            refuse = None if self.token.enabled else NO_TOKEN_NO_EXPANSION
            result = await self.supervisor.judge(text.encode("utf-8"), source, refuse=refuse)
        return web.Response(body=orjson.dumps(result.to_json()), content_type=_JSON)


async def _candidate(request: web.Request, mode: str) -> tuple[str, str]:
    """The candidate's text and name from a refresh request's body; :class:`RequestError`
    naming the field when the body is not ``{"candidate": TEXT[, "source": NAME]}``."""
    if mode != "dry_run":
        raise RequestError(
            "invalid_request_error",
            f"A candidate in the request body is judged with mode=dry_run only (this request "
            f"asked for mode={mode[:40]!r}): the daemon applies only its own config file. Write "
            "the candidate there and refresh with mode=apply (or send no body).",
            param="mode",
        )
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise RequestError(
            "request_too_large",
            f"The request body is larger than {MAX_CANDIDATE_BODY:,} bytes; a candidate "
            f"config may be at most {MAX_FILE_BYTES // 2**20} MiB ({MAX_FILE_BYTES:,} bytes).",
            status=413,
        ) from None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RequestError(
            "invalid_request_error", f"The request body is not valid JSON: {exc}."
        ) from None
    if not isinstance(body, dict):
        raise RequestError(
            "invalid_request_error",
            f'The request body is a JSON {type(body).__name__}; send {{"candidate": "<the '
            'config file\'s text>", "source": "<its name>"}.',
        )
    unknown = sorted(set(body) - {"candidate", "source"})
    if unknown:
        raise RequestError(
            "invalid_request_error",
            f"Unknown field {unknown[0][:40]!r} in the request body; the fields are "
            "'candidate' (the config text) and 'source' (its name, optional).",
            param=unknown[0][:40],
        )
    text = body.get("candidate")
    if not isinstance(text, str):
        raise RequestError(
            "invalid_request_error",
            "'candidate' must be the candidate config file's text, a string "
            f"(got {'nothing' if text is None else 'a JSON ' + type(text).__name__}).",
            param="candidate",
        )
    source = body.get("source", "candidate")
    if not isinstance(source, str) or not source.isprintable() or len(source) > MAX_SOURCE_LENGTH:
        raise RequestError(
            "invalid_request_error",
            f"'source' must be a printable name of at most {MAX_SOURCE_LENGTH} characters "
            "(the candidate's file name, shown in its errors).",
            param="source",
        )
    return text, source or "candidate"


def _refusal(exc: IopEdgeError) -> web.Response:
    """A refused admin request, in the OpenAI error envelope."""
    status, code, param = describe(exc)
    return web.Response(
        body=envelope(str(exc), code, status=status, param=param),
        status=status,
        content_type=_JSON,
    )


__all__ = ["AdminAPI"]
