"""The Grafana dashboard and the alert rules name only what the daemon exports (issue 15).

Every PromQL expression of ``deploy/grafana/iop-edge.json`` (panels, template variables,
annotations) and of ``deploy/prometheus/alerts.yml`` is read for the metric names it selects,
the label names its matchers use and the labels it groups by; each must be one a real daemon
exports. The exported set is what ``/metrics`` of a daemon shows after traffic that touches
every series the files use (a failover, a stream, a reload), so a renamed metric or label (a
``kind`` that became ``slot``) fails here, not on an operator's screen.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from iop_edge.testing.hostile_node import DialRefused, ScriptedNode
from iop_edge.testing.redis_server import RedisServer
from tests.helpers import ROOT, dump, edge_on, wait_for
from tests.helpers.remote_nodes import answering_node, link_url, with_remote_node

DASHBOARD = ROOT / "deploy/grafana/iop-edge.json"
ALERTS = ROOT / "deploy/prometheus/alerts.yml"
#: labels Prometheus adds to every scraped series (the target's)
TARGET_LABELS = frozenset({"instance", "job"})
#: series Prometheus makes itself, with their labels
SYNTHETIC = {"up": TARGET_LABELS}

# --- reading PromQL --------------------------------------------------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)?\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
_IDENT = re.compile(r"(?<![A-Za-z0-9_:.$])([A-Za-z_:][A-Za-z0-9_:]*)(?![A-Za-z0-9_:])(?!\s*\()")
_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
    | {"group_left", "group_right", "inf", "nan"}
)
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$")


@dataclass
class References:
    """What one PromQL expression names."""

    metrics: set[str] = field(default_factory=set)
    #: (metric, label) of every matcher on a named selector
    matchers: set[tuple[str, str]] = field(default_factory=set)
    #: labels of by/without/on/ignoring/group_* clauses
    grouping: set[str] = field(default_factory=set)


def references(expr: str) -> References:
    """The metric names, matcher labels and grouping labels of one PromQL expression (or a
    Grafana ``label_values(selector, label)`` query)."""
    found = References()
    label_values = _LABEL_VALUES.match(expr)
    if label_values:
        expr, label = label_values.groups()
        found.grouping.add(label)
    text = _STRING.sub('""', expr)
    for name, body in _SELECTOR.findall(text):
        for label in _MATCHER.findall(body):
            if name:
                found.matchers.add((name, label))
    text = _SELECTOR.sub(lambda m: m.group(1) or "", text)
    text = _RANGE.sub("", text)
    for labels in _GROUPING.findall(text):
        found.grouping.update(x.strip() for x in labels.split(",") if x.strip())
    text = _GROUPING.sub("", text)
    found.metrics.update(n for n in _IDENT.findall(text) if n not in _KEYWORDS)
    return found


def test_the_promql_reader_finds_names_matchers_and_grouping():
    """The reader the checks below rely on, on the shapes the files use."""
    found = references(
        'histogram_quantile(0.95, sum by (model, le) (rate(iop_edge_x_bucket{instance=~"$i", '
        'code!="a{b}"}[$__rate_interval]))) / on(instance) group_left '
        "sum without (slot) (iop_edge_y) > 1e3 and vector(0)"
    )
    assert found.metrics == {"iop_edge_x_bucket", "iop_edge_y"}
    assert found.matchers == {("iop_edge_x_bucket", "instance"), ("iop_edge_x_bucket", "code")}
    assert found.grouping == {"model", "le", "instance", "slot"}
    values = references('label_values(iop_edge_requests_total{instance=~"$instance"}, model)')
    assert values.metrics == {"iop_edge_requests_total"}
    assert values.grouping == {"model"}


# --- the files' expressions ------------------------------------------------------------------


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def dashboard_expressions(dashboard: dict[str, Any]) -> dict[str, str]:
    """Every PromQL expression of the dashboard, keyed by where it is."""
    found: dict[str, str] = {}
    for panel in _panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            found[f"panel {panel['title']!r} {target['refId']}"] = target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            found[f"variable {variable['name']}"] = variable["query"]["query"]
    for annotation in dashboard["annotations"]["list"]:
        found[f"annotation {annotation['name']}"] = annotation["expr"]
    return found


def alert_expressions() -> dict[str, str]:
    rules = yaml.safe_load(ALERTS.read_text())
    return {f"alert {r['alert']}": r["expr"] for g in rules["groups"] for r in g["rules"]}


# --- what the daemon exports -----------------------------------------------------------------


def group_doc(
    a: FakeOpenAI, b: FakeOpenAI, capacity: int = 2, store: str | None = None
) -> dict[str, Any]:
    """Model ``chat`` on providers ``a`` (tried first) and ``b``; with ``store``, the pool
    shared through it (a Redis URL)."""
    pool: dict[str, Any] = {"max_queue": 8, "queue_timeout_ms": 30000}
    if store is not None:
        pool["shared"] = {"store": store}
    providers = [
        {
            "id": pid,
            "type": "openai_compat",
            "category": "api",
            "adapter": "oa",
            "base_url": fake.base_url,
            "models": ["fake-model"],
            "capacity": capacity,
            "priority": priority,
        }
        for priority, (pid, fake) in enumerate((("a", a), ("b", b)))
    ]
    return {
        "openai": {"listen": "127.0.0.1:0"},
        "metrics": {"listen": "127.0.0.1:0"},
        "console": {"listen": "127.0.0.1:0"},
        "provider_pool": pool,
        "models": [{"id": "chat", "context_window_tokens": 4096, "providers": ["a", "b"]}],
        "nodes": [
            {
                "id": "n1",
                "adapters": [{"name": "oa", "type": "openai_compat"}],
                "providers": providers,
            }
        ],
    }


@pytest.fixture(scope="module")
def exported(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer
) -> dict[str, frozenset[str]]:
    """Sample name → its label names, from ``/metrics`` of a daemon after a failover, a
    stream, a plain answer and an applied reload, with a remote node connected (its round
    trip measured), a node's dial refused, and its pool shared through a real store."""
    redis_server.flushall()
    store = redis_server.url

    async def run() -> str:
        tmp_path = tmp_path_factory.mktemp("exported")
        async with FakeOpenAI() as a, FakeOpenAI() as b:
            a.enqueue(FakeBehavior(status=503))
            async with (
                edge_on(tmp_path, with_remote_node(group_doc(a, b, store=store))) as edge,
                answering_node(edge.daemon),
            ):
                # the round trip is measured once the node answered a PING; a dial with
                # another token is refused (and counted)
                await wait_for(lambda: edge.daemon.node_statistics()[1].rtt is not None)
                with pytest.raises(DialRefused):
                    await ScriptedNode.dial(link_url(edge.daemon), "iopn_not-a-node-token")
                async with openai.AsyncOpenAI(
                    base_url=edge.daemon.openai_url, api_key="x", max_retries=0
                ) as sdk:
                    messages: Any = [{"role": "user", "content": "hello there"}]
                    await sdk.chat.completions.create(model="chat", messages=messages)
                    stream = await sdk.chat.completions.create(
                        model="chat", messages=messages, stream=True
                    )
                    async for _ in stream:
                        pass
                edge.path.write_text(
                    dump(with_remote_node(group_doc(a, b, capacity=3, store=store)))
                )
                result = await edge.supervisor.refresh("api")
                assert result.result == "applied"
                async with (
                    aiohttp.ClientSession() as session,
                    session.get(edge.daemon.metrics_url) as response,
                ):
                    return await response.text()

    text = asyncio.run(run())
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    exported = {name: frozenset(found) for name, found in labels.items()}
    exported.update(SYNTHETIC)
    return exported


def problems(where: str, expr: str, exported: dict[str, frozenset[str]]) -> list[str]:
    """What in ``expr`` the daemon does not export."""
    found = references(expr)
    wrong = [f"{where}: no metric {m!r}" for m in sorted(found.metrics - exported.keys())]
    for metric, label in sorted(found.matchers):
        if metric in exported and label not in exported[metric] | TARGET_LABELS:
            wrong.append(f"{where}: {metric} has no label {label!r}")
    known = TARGET_LABELS.union(*(exported.get(m, frozenset()) for m in found.metrics))
    wrong.extend(f"{where}: groups by {x!r}, a label none of its metrics has"
                 for x in sorted(found.grouping - known))  # fmt: skip
    if not found.metrics:
        wrong.append(f"{where}: names no metric")
    return wrong


def test_every_metric_and_label_the_dashboard_names_is_exported(exported):
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = dashboard_expressions(dashboard)
    assert len(expressions) > 40
    wrong = [p for where, expr in expressions.items() for p in problems(where, expr, exported)]
    assert wrong == []


def test_every_metric_and_label_the_alert_rules_name_is_exported(exported):
    expressions = alert_expressions()
    wrong = [p for where, expr in expressions.items() for p in problems(where, expr, exported)]
    assert wrong == []


def test_the_check_fails_on_an_old_or_unknown_name(exported):
    """The checks can fail: the label ``kind`` (now ``slot``), the old upstream-errors label,
    a metric that does not exist, a grouping label of no metric."""
    assert problems("x", 'iop_edge_provider_in_flight{kind="general"}', exported) == [
        "x: iop_edge_provider_in_flight has no label 'kind'"
    ]
    assert problems("x", "sum by (kind) (iop_edge_upstream_errors_total)", exported) == [
        "x: groups by 'kind', a label none of its metrics has"
    ]
    assert problems("x", "rate(iop_edge_upstream_errors[5m])", exported) == [
        "x: no metric 'iop_edge_upstream_errors'"
    ]


def test_the_dashboard_shows_what_an_operator_looks_at_first():
    """Traffic and errors per model and app, TTFT and latency percentiles, queue depth and
    waits, slots per provider, health, remote nodes' links, the shared store and reloads;
    every panel on the dashboard's data source, with its own id, inside the 24-column grid."""
    dashboard = json.loads(DASHBOARD.read_text())
    named: set[str] = set()
    grouped: set[str] = set()
    for expr in dashboard_expressions(dashboard).values():
        found = references(expr)
        named |= found.metrics
        grouped |= found.grouping
    assert {
        "iop_edge_requests_total",
        "iop_edge_time_to_first_token_seconds_bucket",
        "iop_edge_request_duration_seconds_bucket",
        "iop_edge_provider_request_duration_seconds_bucket",
        "iop_edge_queue_depth",
        "iop_edge_queue_max",
        "iop_edge_queue_wait_seconds_bucket",
        "iop_edge_provider_in_flight",
        "iop_edge_provider_capacity",
        "iop_edge_provider_up",
        "iop_edge_provider_requests_total",
        "iop_edge_model_enabled_providers",
        "iop_edge_config_reloads_total",
        "iop_edge_config_last_reload_successful",
        "iop_edge_node_connected",
        "iop_edge_node_link_rtt_seconds",
        "iop_edge_node_link_bytes_total",
        "iop_edge_node_link_in_flight",
        "iop_edge_node_reconnects_total",
        "iop_edge_shared_store_up",
        "iop_edge_provider_leases",
        "iop_edge_shared_store_latency_seconds_bucket",
        "iop_edge_shared_store_errors_total",
    } <= named
    assert {"model", "token_ref", "code", "slot", "le", "direction"} <= grouped
    panels = list(_panels(dashboard["panels"]))
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"], panel["title"]
            assert panel.get("description"), panel["title"]
