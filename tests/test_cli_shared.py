"""``iop-edge status`` shows a pool shared by several edges: a line for the store (state,
members, this edge's instance, the lease time, what rules while it is down), what the store
refused and lost, and a table of each provider's leases over every edge next to this edge's."""

from __future__ import annotations

from typing import Any

from iop_edge.cli import format_status
from iop_edge.cli.render import shared_lines

STORE = "redis://:<redacted>@10.0.0.5:6379/0"


def provider(node: str, pid: str, **fields: Any) -> dict[str, Any]:
    """A provider's entry of the status, as the admin API gives it."""
    entry = {
        "node": node,
        "id": pid,
        "status": "active",
        "health": "healthy",
        "enabled": True,
        "capacity": 4,
        "long_context_capacity": 2,
        "in_flight": 1,
        "long_in_flight": 0,
        "held_elsewhere": 2,
        "long_held_elsewhere": 1,
        "priority": 0,
    }
    return entry | fields


def shared(**fields: Any) -> dict[str, Any]:
    """The ``shared`` section of a status: the store up, two edges, one provider."""
    section = {
        "instance_id": "a1b2c3d4e5f6",
        "store": STORE,
        "state": "up",
        "down_since": None,
        "last_error": None,
        "on_store_down": "static_split",
        "lease_ttl_ms": 10000,
        "members": 2,
        "leases": 1,
        "refused": 0,
        "lost": 0,
        "store_errors": 0,
        "providers": [
            {"node": "gpu", "id": "vllm", "held": 3, "long_held": 1, "mine": 1, "long_mine": 0}
        ],
    }
    return section | fields


def status_with(section: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "edge": "edge-1",
        "pid": 42,
        "config": {"hash": "f" * 64, "generation": 1, "path": "/etc/iop-edge/edge.yaml"}
        | {"restart_pending": [], "last_refresh": None},
        "queue": {"depth": 0, "max_queue": 8, "queue_timeout_ms": 30000},
        "nodes": [],
        "providers": [provider("gpu", "vllm")],
        "shared": section,
        "counters": {"admitted": 0, "released": 0, "rejected": {}},
    }


def test_an_edge_alone_prints_nothing_of_a_shared_pool() -> None:
    assert shared_lines(None, []) == []
    assert "shared pool" not in format_status(status_with(None))
    assert "shared pool" not in format_status(status_with(None) | {"shared": None})
    older = status_with(None)
    del older["shared"]  # (a daemon from before shared pools)
    assert "shared pool" not in format_status(older)


def test_the_store_up_is_a_line_and_each_provider_a_row_of_global_and_local_counts() -> None:
    assert shared_lines(shared(), [provider("gpu", "vllm")]) == [
        "",
        f"shared pool: store {STORE} up, 2 edge(s) (this one a1b2c3d4e5f6), lease_ttl_ms "
        "10000, on_store_down static_split",
        "NODE  PROVIDER  ALL_EDGES  HERE  ELSEWHERE  CAPACITY  LONG_ALL",
        "gpu   vllm      3          1     2          4         1/2",
    ]


def test_the_store_down_says_since_when_what_rules_and_the_last_error() -> None:
    down = shared(
        state="down",
        down_since="2026-12-04T03:12:09.001+00:00",
        last_error=f"shared store {STORE}: renew failed: no answer within 0.5 s",
    )
    lines = shared_lines(down, [provider("gpu", "vllm")])
    assert lines[1].startswith(f"shared pool: store {STORE} DOWN, 2 edge(s)")
    assert lines[2] == (
        "  out of reach since 2026-12-04T03:12:09.001+00:00: this edge holds its static split "
        "of each provider (capacity / members, the others' last known leases kept)"
    )
    assert lines[3] == f"  last error: shared store {STORE}: renew failed: no answer within 0.5 s"
    assert lines[-1] == "ALL_EDGES and LONG_ALL: as last seen before the store went down"
    rejecting = shared_lines(down | {"on_store_down": "reject"}, [provider("gpu", "vllm")])
    assert rejecting[2].endswith(": this edge refuses new requests (503 store_unavailable)")


def test_recovering_refusals_and_lost_leases_are_said() -> None:
    lines = shared_lines(shared(state="recovering", refused=7, lost=1), [])
    assert lines[2] == (
        "  the store answers again: this edge's leases are written back; the static split "
        "holds for one more renewal period"
    )
    assert lines[3] == (
        "  refused by the store (full elsewhere): 7 dispatch(es); leases lost (not renewed in "
        "time): 1"
    )
    # a provider the status does not list (the store's view only): '-' for its local figures
    assert lines[-1].split() == ["gpu", "vllm", "3", "-", "-", "-", "1/-"]


def test_the_shared_pool_comes_after_the_nodes_and_before_the_providers() -> None:
    lines = format_status(status_with(shared())).splitlines()
    store = next(i for i, line in enumerate(lines) if line.startswith("shared pool:"))
    table = next(i for i, line in enumerate(lines) if line.startswith("NODE  PROVIDER  STATUS"))
    assert store < table
