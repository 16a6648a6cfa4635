"""``iop-edge status`` shows the nodes (issue 29 item 10): local ones on one line; with a
remote node, a table — kind, connected, since, peer, agent, acknowledged payload generation,
in flight, round trip — and a line for a node that is down, runs another generation or
reconnected."""

from __future__ import annotations

from typing import Any

from iop_edge.cli import format_status
from iop_edge.cli.render import node_lines

LINK_NULLS = dict.fromkeys(
    (
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
)


def local(node_id: str) -> dict[str, Any]:
    return {"id": node_id, "kind": "local", "connected": True} | LINK_NULLS


def remote(node_id: str, **fields: Any) -> dict[str, Any]:
    up = {
        "id": node_id,
        "kind": "remote",
        "connected": True,
        "connected_since": "2026-12-01T10:00:00.000+00:00",
        "peer": "10.1.2.3:50123",
        "agent_version": "0.2.0",
        "protocol": 1,
        "generation": "0123456789abcdef",
        "generation_acked": "0123456789abcdef",
        "in_flight": 3,
        "reconnects": 0,
        "rtt_ms": 0.412,
        "bytes_sent": 1000,
        "bytes_received": 5000,
        "violations": 0,
        "last_down": None,
    }
    return up | fields


def status_with(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "edge": "edge-1",
        "pid": 42,
        "config": {"hash": "f" * 64, "generation": 1, "path": "/etc/iop-edge/edge.yaml"}
        | {"restart_pending": [], "last_refresh": None},
        "queue": {"depth": 0, "max_queue": 8, "queue_timeout_ms": 30000},
        "nodes": nodes,
        "providers": [],
        "counters": {"admitted": 0, "released": 0, "rejected": {}},
    }


def table(lines: list[str]) -> list[list[str]]:
    """The table's rows, split into cells (the header first)."""
    rows = [line.split() for line in lines if line]
    return [row for row in rows if row[0] in {"NODE", "gpu", "lab", "local"}]


def test_local_nodes_only_take_one_line():
    assert node_lines([local("local"), local("other")]) == [
        "",
        "nodes: local, other (local, in this process)",
    ]
    assert node_lines([]) == []


def test_a_remote_node_is_a_row_of_the_nodes_table_beside_the_local_ones():
    lines = node_lines([local("local"), remote("gpu")])
    assert table(lines) == [
        ["NODE", "KIND", "CONNECTED", "SINCE", "PEER", "AGENT", "GENERATION", "IN_FLIGHT", "RTT"],
        ["local", "local", "yes", "-", "-", "-", "-", "-", "-"],
        [
            *("gpu", "remote", "yes", "2026-12-01T10:00:00.000+00:00", "10.1.2.3:50123"),
            *("0.2.0", "0123456789abcdef", "3", "0.41", "ms"),
        ],
    ]
    assert [line for line in lines if line.startswith("node ")] == []  # nothing to say


def test_a_node_that_is_down_says_since_when_and_why():
    lines = node_lines(
        [
            remote(
                "gpu",
                connected=False,
                connected_since=None,
                peer=None,
                agent_version=None,
                generation_acked=None,
                rtt_ms=None,
                in_flight=0,
                reconnects=2,
                last_down={"at": "2026-12-01T10:05:00.000+00:00", "reason": "heartbeat"},
            ),
            remote("lab", connected=False, connected_since=None, peer=None, rtt_ms=None),
        ]
    )
    assert table(lines)[1] == ["gpu", "remote", "no", "-", "-", "-", "-", "0", "-"]
    notes = [line for line in lines if line.startswith("node ")]
    assert notes == [
        "node gpu: disconnected since 2026-12-01T10:05:00.000+00:00 (heartbeat): its providers "
        "are out of the pool until its iop-node dials in again",
        "node gpu: reconnected 2 time(s) in this process",
        "node lab: disconnected (no link since the edge started): its providers are out of the "
        "pool until its iop-node dials in again",
    ]


def test_a_node_on_another_payload_generation_is_pointed_out():
    lines = node_lines([remote("gpu", generation_acked="fedcba9876543210")])
    assert (
        "node gpu: acknowledged payload generation fedcba9876543210; the edge's is 0123456789abcdef"
    ) in lines


def test_a_long_agent_version_is_cut_to_a_cell():
    """The node, not the edge, chose it."""
    (row,) = table(node_lines([remote("gpu", agent_version="x" * 500)]))[1:]
    assert row[5] == "x" * 57 + "..."


def test_the_status_prints_the_nodes_before_the_providers():
    lines = format_status(status_with([local("local"), remote("gpu")])).splitlines()
    headers = [line.split()[:2] for line in lines if line.startswith("NODE ")]
    assert headers == [["NODE", "KIND"], ["NODE", "PROVIDER"]]
    # a daemon of before the nodes (no "nodes" in its status) prints no nodes
    older = status_with([])
    del older["nodes"]
    assert [
        line.split()[1] for line in format_status(older).splitlines() if line.startswith("NODE ")
    ] == ["PROVIDER"]
