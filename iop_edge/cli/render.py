"""The renderers of the ``iop-edge`` command line: what a command prints of a config's
problems, a refresh result, the effective config, the running daemon's status and a restart's
answer — text for a person, or JSON. They return text (or print it where the form is a list
of lines on stderr); the commands decide where it goes and with which exit code."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from iop_edge.config import ConfigError
from iop_edge.config.refresh import RefreshResult


def print_problems(exc: ConfigError, as_json: bool) -> None:
    """Every problem of a config that does not load: a line each on stderr, or with
    ``as_json`` the ``{"valid": false, "errors": [...]}`` document on stdout."""
    if as_json:
        print(
            json.dumps(
                {
                    "valid": False,
                    "errors": [{"path": p.path, "message": p.message} for p in exc.problems],
                },
                indent=2,
            )
        )
        return
    for problem in exc.problems:
        print(problem, file=sys.stderr)


def config_text(data: dict[str, Any], as_json: bool) -> str:
    """The effective config (already redacted) as ``config show`` prints it: YAML, or JSON."""
    if as_json:
        return json.dumps(data, indent=2) + "\n"
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def format_refresh(result: RefreshResult) -> str:
    """A refresh result as a readable table (the JSON form is ``result.to_json()``)."""
    dry = result.mode == "dry_run"
    if dry:
        verdict = {
            "applied": "would apply",
            "restart_required": "would need a restart",
            "rejected": "would be rejected",
        }[result.result]
        lines = [f"result: {verdict} (dry run: nothing was applied)"]
    else:
        lines = [f"result: {result.result} (mode {result.mode})"]
    for label, ids in (
        ("nodes", result.changed_nodes),
        ("providers", result.changed_providers),
        ("models", result.changed_models),
    ):
        if ids:
            lines.append(f"changed {label}: {', '.join(ids)}")
    if result.report:
        # A dry run says what an apply would take: the live changes, unless they cannot
        # stand alone (errors).
        would = not result.errors
        rows = [("CLASS", "WOULD APPLY" if dry else "APPLIED", "PATH", "OLD", "NEW")] + [
            (
                e.change_class,
                "yes" if (e.change_class == "live" and would if dry else e.applied) else "no",
                e.path,
                cell(e.old),
                cell(e.new),
            )
            for e in result.report
        ]
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        lines.append("")
        lines += [
            "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:4])) + "  " + row[4]
            for row in rows
        ]
        reasons = [e for e in result.report if e.reason]
        if reasons:
            lines.append("")
            lines += [f"{e.path} needs a restart: {e.reason}" for e in reasons]
    elif result.result != "rejected":
        lines.append("no changes")
    if result.errors:
        lines.append("")
        lines.append("errors:")
        lines += [f"  {e.path}: {e.message}" if e.path else f"  {e.message}" for e in result.errors]
    if result.config_hash:
        lines.append("")
        lines.append(f"running config hash: {result.config_hash}")
    return "\n".join(lines)


def cell(value: Any) -> str:
    """A value in a table cell: ``-`` for none, JSON for a structure, cut at 60 characters."""
    if value is None:
        return "-"
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text if len(text) <= 60 else text[:57] + "..."


def format_status(status: dict[str, Any]) -> str:
    """``/admin/status`` as a readable table."""
    config = status["config"]
    queue = status["queue"]
    timeout = queue["queue_timeout_ms"]
    lines = [
        f"edge {status['edge']} (pid {status.get('pid', '?')}): config "
        f"{config['hash'][:12]} (generation {config['generation']}) from {config['path']}",
        f"queue: {queue['depth']} pending (max {queue['max_queue']}, timeout "
        f"{f'{timeout} ms' if timeout else 'none'})",
    ]
    if config.get("watch") is False:
        lines.append(
            "config file not watched (reload.watch: false): refresh with SIGHUP "
            "(systemctl reload) or iop-edge config refresh --apply"
        )
    taken = status.get("handover")
    if taken:
        lines.append(
            f"took over from process {taken['from_pid']} at {taken['at']} in "
            f"{taken['duration_ms']:g} ms: {taken['inherited_leases']} slot(s) inherited "
            f"({taken['inherited_held']} still held), {taken['relayed_requests']} request(s) "
            f"relayed; the old process {'still drains' if taken['old_running'] else 'exited'}"
        )
    last = config.get("last_refresh")
    if last:
        lines.append(f"last refresh: {last['result']} ({last['trigger']})")
        lines += [f"  error: {e['path']}: {e['message']}" for e in last["errors"]]
    pending = config["restart_pending"]
    if pending:
        lines.append(f"restart pending for {len(pending)} change(s):")
        lines += [
            f"  {p['path']}: {cell(p['old'])} -> {cell(p['new'])}"
            + (f" ({p['reason']})" if p.get("reason") else "")
            for p in pending
        ]
    lines += node_lines(status.get("nodes", ()))
    lines += shared_lines(status.get("shared"), status["providers"])
    rows = [("NODE", "PROVIDER", "STATUS", "HEALTH", "IN_FLIGHT", "CAPACITY", "LONG", "PRIORITY")]
    rows += [
        (
            p["node"],
            p["id"],
            p["status"],
            p["health"],
            str(p["in_flight"]),
            str(p["capacity"]),
            f"{p['long_in_flight']}/{p['long_context_capacity']}",
            str(p["priority"]),
        )
        for p in status["providers"]
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines.append("")
    lines += ["  ".join(c.ljust(widths[i]) for i, c in enumerate(row)).rstrip() for row in rows]
    for p in status["providers"]:
        lines += health_lines(p)
    for model in status.get("models", ()):
        if model["panic"] and not model.get("derived_from"):  # (a model's panic, once)
            lines.append(
                f"model {model['id']}: PANIC - every enabled provider is ejected; health is "
                "ignored for it until one recovers"
            )
    lines += principal_lines(status.get("principals", ()))
    counters = status["counters"]
    rejected = ", ".join(f"{k} {v}" for k, v in sorted(counters["rejected"].items()) if v)
    lines.append("")
    lines.append(
        f"admitted {counters['admitted']}, inherited {counters.get('inherited', 0)}, released "
        f"{counters['released']}, failovers {counters.get('failovers', 0)}, rejected: "
        f"{rejected or 'none'}"
    )
    return "\n".join(lines)


def node_lines(nodes: Sequence[dict[str, Any]]) -> list[str]:
    """The nodes: with only local ones, one line naming them; with a remote one, a table (a
    row per node, ``-`` where a local node has no link), then a line for each remote node
    that is down (since when and why), runs another payload generation, or reconnected."""
    if not nodes:
        return []
    if all(n["kind"] == "local" for n in nodes):
        return ["", f"nodes: {', '.join(n['id'] for n in nodes)} (local, in this process)"]

    def shown(value: object) -> str:
        return "-" if value is None else str(value)

    rows = [
        ("NODE", "KIND", "CONNECTED", "SINCE", "PEER", "AGENT", "GENERATION", "IN_FLIGHT", "RTT")
    ]
    for n in nodes:
        rtt = n.get("rtt_ms")
        rows.append(
            (
                n["id"],
                n["kind"],
                "yes" if n["connected"] else "no",
                shown(n.get("connected_since")),
                shown(n.get("peer")),
                cell(n.get("agent_version")),
                shown(n.get("generation_acked")),
                shown(n.get("in_flight")),
                "-" if rtt is None else f"{rtt:.2f} ms",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [""]
    lines += ["  ".join(c.ljust(widths[i]) for i, c in enumerate(row)).rstrip() for row in rows]
    for n in (n for n in nodes if n["kind"] == "remote"):
        name, down = n["id"], n.get("last_down")
        if n["connected"] and n.get("generation_acked") != n.get("generation"):
            lines.append(
                f"node {name}: acknowledged payload generation {n.get('generation_acked')}; "
                f"the edge's is {n.get('generation')}"
            )
        elif not n["connected"]:
            since = (
                f"since {down['at']} ({down['reason']})"
                if down
                else "(no link since the edge started)"
            )
            lines.append(
                f"node {name}: disconnected {since}: its providers are out of the pool until "
                "its iop-node dials in again"
            )
        if n.get("reconnects"):
            lines.append(f"node {name}: reconnected {n['reconnects']} time(s) in this process")
    return lines


def shared_lines(shared: dict[str, Any] | None, providers: Sequence[dict[str, Any]]) -> list[str]:
    """A pool shared by several edges (nothing otherwise): a line for the store — its state,
    the members, what it refused and lost, and while it is down since when, why and what rules
    meanwhile — then a table of each provider's leases over every edge (``ALL_EDGES``, the
    store's count) next to this edge's (``HERE``: in flight here) and what this edge counts
    as held by the others (``ELSEWHERE``: their leases, or a static split's reserve)."""
    if not shared:
        return []
    state, mode = shared["state"], shared["on_store_down"]
    lines = [
        "",
        f"shared pool: store {shared['store']} {'DOWN' if state == 'down' else state}, "
        f"{shared['members']} edge(s) (this one {shared['instance_id']}), lease_ttl_ms "
        f"{shared['lease_ttl_ms']}, on_store_down {mode}",
    ]
    if state == "down":
        meanwhile = (
            "this edge holds its static split of each provider (capacity / members, the "
            "others' last known leases kept)"
            if mode == "static_split"
            else "this edge refuses new requests (503 store_unavailable)"
        )
        lines.append(f"  out of reach since {shared['down_since']}: {meanwhile}")
        if shared.get("last_error"):
            lines.append(f"  last error: {shared['last_error']}")
    elif state == "recovering":
        lines.append(
            "  the store answers again: this edge's leases are written back; the static split "
            "holds for one more renewal period"
        )
    if shared["refused"] or shared["lost"]:
        lines.append(
            f"  refused by the store (full elsewhere): {shared['refused']} dispatch(es); "
            f"leases lost (not renewed in time): {shared['lost']}"
        )
    local = {(p["node"], p["id"]): p for p in providers}
    rows = [("NODE", "PROVIDER", "ALL_EDGES", "HERE", "ELSEWHERE", "CAPACITY", "LONG_ALL")]
    for p in shared["providers"]:
        mine = local.get((p["node"], p["id"]), {})
        rows.append(
            (
                p["node"],
                p["id"],
                str(p["held"]),
                str(mine.get("in_flight", "-")),
                str(mine.get("held_elsewhere", "-")),
                str(mine.get("capacity", "-")),
                f"{p['long_held']}/{mine.get('long_context_capacity', '-')}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(c.ljust(widths[i]) for i, c in enumerate(row)).rstrip() for row in rows]
    if state == "down":
        lines.append("ALL_EDGES and LONG_ALL: as last seen before the store went down")
    return lines


def principal_lines(principals: Sequence[dict[str, Any]]) -> list[str]:
    """The fair-share table: one row per principal (SPEC §5.2); ``-`` is no limit."""

    def limit(value: object) -> str:
        return "-" if value is None else str(value)

    rows = [("PRINCIPAL", "WEIGHT", "IN_FLIGHT", "QUEUED", "MAX_IN_FLIGHT", "MAX_QUEUED", "RPM")]
    rows += [
        (
            p["principal"],
            f"{p['weight']:g}",
            str(p["in_flight"]),
            str(p["queued"]),
            limit(p["max_in_flight"]),
            limit(p["max_queued"]),
            limit(p["max_requests_per_minute"]),
        )
        for p in principals
    ]
    if len(rows) == 1:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [""]
    lines += ["  ".join(c.ljust(widths[i]) for i, c in enumerate(row)).rstrip() for row in rows]
    for p in principals:
        refused = ", ".join(f"{k} {v}" for k, v in sorted(p["rejected"].items()) if v)
        if refused:
            lines.append(f"principal {p['principal']}: rejected {refused}")
    return lines


def health_lines(provider: dict[str, Any]) -> list[str]:
    """What an operator needs about a provider that is not plainly healthy."""
    name = f"{provider['node']}/{provider['id']}"
    lines = []
    if provider.get("ejected_until"):
        lines.append(
            f"{name}: ejected until {provider['ejected_until']} after "
            f"{provider['consecutive_failures']} consecutive failure(s)"
        )
    elif provider.get("half_open"):
        lines.append(f"{name}: half-open, the next request is a trial")
    if lines and provider.get("probes_trusted") is False:
        lines.append(
            "  its probes pass but its requests fail: probes no longer end its ejections "
            "(each runs to its end, then one trial request) until a request succeeds"
        )
    if provider.get("held_until"):
        lines.append(f"{name}: held out until {provider['held_until']} (429 Retry-After)")
    if lines and provider.get("last_failure"):
        lines.append(f"  last failure: {provider['last_failure']}")
    return lines


def restart_lines(result: dict[str, Any]) -> list[str]:
    """``iop-edge restart``'s answer, ``/admin/restart``, as text: one line, and each
    problem of a config that stopped the restart."""
    if result["result"] == "handed_over":
        return [f"handed over to process {result['pid']}; this one drains and exits"]
    lines = [f"not restarted ({result['result']}): {result['message']}"]
    lines += [f"  {error['path']}: {error['message']}" for error in result.get("errors", ())]
    return lines
