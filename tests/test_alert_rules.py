"""The alert rules' unit tests (issue 15): ``promtool test rules deploy/prometheus/
alerts.test.yml`` proves each alert of ``alerts.yml`` fires where it should and stays quiet
where it should not. promtool is not a dependency of the project: without it on ``PATH`` these
tests are skipped, saying so (``apt-get install prometheus`` brings it on Debian)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT

RULES = ROOT / "deploy/prometheus"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is not installed (Debian: apt-get install prometheus); the alert rules' "
    "unit tests (deploy/prometheus/alerts.test.yml) did not run",
)


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


@needs_promtool
def test_every_alert_fires_and_stays_quiet_as_its_unit_tests_say():
    checked = promtool("check", "rules", "alerts.yml", cwd=RULES)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", "alerts.test.yml", cwd=RULES)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


# Each change breaks one alert; the unit tests must notice (a test file that passes whatever
# the rules say would prove nothing).
MUTATIONS = {
    "error-rate-threshold-too-high": (
        "rate(iop_edge_provider_requests_total[5m])) > 0.05",
        "rate(iop_edge_provider_requests_total[5m])) > 0.5",
        "IopEdgeProviderErrorRate",
    ),
    "error-rate-counts-the-clients-4xx": (
        'code=~"upstream_error|upstream_timeout"',
        'code=~"upstream_error|upstream_timeout|client_error"',
        "IopEdgeProviderErrorRate",
    ),
    "edge-down-without-waiting": (
        'up{job="iop-edge"} == 0\n        for: 2m',
        'up{job="iop-edge"} == 0\n        for: 0m',
        "IopEdgeDown",
    ),
    "model-no-provider-too-eager": (
        "iop_edge_model_enabled_providers == 0",
        "iop_edge_model_enabled_providers < 3",
        "IopEdgeModelNoProvider",
    ),
    "remote-node-down-without-waiting": (
        "iop_edge_node_connected == 0\n        for: 1m",
        "iop_edge_node_connected == 0\n        for: 0m",
        "IopEdgeRemoteNodeDown",
    ),
    "provider-down-also-for-a-node-that-is-down": (
        "iop_edge_provider_up == 0 unless on (instance, node) iop_edge_node_connected == 0",
        "iop_edge_provider_up == 0",
        "IopEdgeProviderDown",
    ),
    "provider-down-hidden-by-another-edge-s-node": (
        "unless on (instance, node) iop_edge_node_connected",
        "unless on (node) iop_edge_node_connected",
        "IopEdgeProviderDown",
    ),
    "shared-store-down-without-waiting": (
        "iop_edge_shared_store_up == 0\n        for: 1m",
        "iop_edge_shared_store_up == 0\n        for: 0m",
        "IopEdgeSharedStoreDown",
    ),
    "shared-store-down-never": (
        "iop_edge_shared_store_up == 0\n",
        "iop_edge_shared_store_up < 0\n",
        "IopEdgeSharedStoreDown",
    ),
    "flapping-too-eager": (
        "increase(iop_edge_node_reconnects_total[15m]) > 5",
        "increase(iop_edge_node_reconnects_total[15m]) > 2",
        "IopEdgeRemoteNodeFlapping",
    ),
    "ttft-threshold-too-high": (
        "rate(iop_edge_time_to_first_token_seconds_bucket[5m]))) > 10",
        "rate(iop_edge_time_to_first_token_seconds_bucket[5m]))) > 30",
        "IopEdgeTimeToFirstTokenHigh",
    ),
}


@needs_promtool
@pytest.mark.parametrize(("old", "new", "alert"), MUTATIONS.values(), ids=MUTATIONS.keys())
def test_the_unit_tests_catch_a_broken_alert(tmp_path, old, new, alert):
    rules = (RULES / "alerts.yml").read_text()
    assert rules.count(old) == 1
    (tmp_path / "alerts.yml").write_text(rules.replace(old, new))
    shutil.copy(RULES / "alerts.test.yml", tmp_path / "alerts.test.yml")
    checked = promtool("check", "rules", "alerts.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr  # still valid rules
    tested = promtool("test", "rules", "alerts.test.yml", cwd=tmp_path)
    assert tested.returncode != 0
    assert f"alertname: {alert}," in tested.stdout + tested.stderr
