"""The admin API on ``console.listen`` (loopback by default; it has no authentication of its
own, so keep it on loopback or behind a firewall).

- ``GET /admin/status``: the running config (hash, generation, restart-pending paths, the last
  refresh) and the scheduler (queue depth, every provider's slots, the counters).
- ``POST /admin/config/refresh?mode=dry_run|apply``: read the config file and refresh; the
  answer is the refresh result (any other mode is ``rejected``).
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from iop_edge.admission import AdmissionScheduler
from iop_edge.supervisor import Supervisor

_JSON = "application/json"


class AdminAPI:
    """Handlers of the admin listener."""

    def __init__(self, edge_id: str, supervisor: Supervisor, scheduler: AdmissionScheduler) -> None:
        self.edge_id = edge_id
        self.supervisor = supervisor
        self.scheduler = scheduler

    def build_app(self) -> web.Application:
        """The aiohttp application of the console listener."""
        app = web.Application()
        app.router.add_get("/admin/status", self.status)
        app.router.add_post("/admin/config/refresh", self.refresh)
        return app

    def snapshot(self) -> dict[str, Any]:
        """Everything ``GET /admin/status`` returns."""
        stats = self.scheduler.statistics()
        return {
            "edge": self.edge_id,
            "config": self.supervisor.status(),
            "queue": {
                "depth": stats.queue_depth,
                "max_queue": stats.max_queue,
                "queue_timeout_ms": stats.queue_timeout_ms,
            },
            "providers": [
                {
                    "node": p.node_id,
                    "id": p.provider_id,
                    "status": p.status,
                    "health": p.health,
                    "enabled": p.enabled,
                    "capacity": p.capacity,
                    "long_context_capacity": p.long_context_capacity,
                    "in_flight": p.in_flight,
                    "long_in_flight": p.long_in_flight,
                    "priority": p.priority,
                }
                for p in stats.providers
            ],
            "counters": {
                "submitted": stats.submitted,
                "admitted": stats.admitted,
                "released": stats.released,
                "double_releases": stats.double_releases,
                "rejected": dict(stats.rejected),
            },
        }

    async def status(self, request: web.Request) -> web.Response:
        """``GET /admin/status``."""
        return web.Response(body=orjson.dumps(self.snapshot()), content_type=_JSON)

    async def refresh(self, request: web.Request) -> web.Response:
        """``POST /admin/config/refresh?mode=dry_run|apply`` (default ``dry_run``)."""
        mode = request.query.get("mode", "dry_run")
        result = await self.supervisor.refresh("api", mode)
        return web.Response(body=orjson.dumps(result.to_json()), content_type=_JSON)


__all__ = ["AdminAPI"]
