"""``deploy/iop-node.service`` (design §6, §7): what it promises systemd — notify with a
watchdog, a restart on failure but never after a permanent refusal (exit 2), the whole control
group stopped (a CLI agent runs in a process group of its own), the token as a credential, the
edge's hardening — read from the file, and the file accepted by ``systemd-analyze verify``."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from iop_edge.testing.node_process import iop_node
from tests.helpers import ROOT

UNIT = ROOT / "deploy" / "iop-node.service"
EDGE_UNIT = ROOT / "deploy" / "iop-edge.service"


def directives(text: str) -> dict[str, list[str]]:
    """Every ``Key=value`` of a unit, comments left out, by key (a key may repeat)."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        found.setdefault(key, []).append(value)
    return found


def test_the_unit_restarts_on_failure_but_never_after_a_permanent_refusal():
    unit = directives(UNIT.read_text())
    assert unit["Type"] == ["notify"]
    assert unit["NotifyAccess"] == ["main"]
    assert unit["WatchdogSec"] == ["30"]
    assert unit["Restart"] == ["on-failure"]
    assert unit["RestartPreventExitStatus"] == ["2"]
    assert unit["KillMode"] == ["control-group"]
    assert unit["KillSignal"] == ["SIGTERM"]
    # the drain (--drain-timeout 30) fits in the stop timeout
    [command] = unit["ExecStart"]
    drain = float(command.split("--drain-timeout ")[1].split()[0])
    assert drain < float(unit["TimeoutStopSec"][0])


def test_the_token_is_a_credential_and_the_edge_comes_from_the_environment_file():
    unit = directives(UNIT.read_text())
    assert unit["LoadCredential"] == ["token:/etc/iop-node/token"]
    [command] = unit["ExecStart"]
    assert command.split()[0] == "/opt/iop-edge/bin/iop-node"
    assert "--token-file %d/token" in command  # %d: the service's credentials directory
    assert "--edge" not in command
    assert unit["EnvironmentFile"] == ["/etc/iop-node/iop-node.env"]
    assert "IOP_NODE_EDGE=" in UNIT.read_text()  # (what the file holds, in a comment)


def test_the_unit_has_every_hardening_setting_of_the_edges():
    edge = directives(EDGE_UNIT.read_text())
    node = directives(UNIT.read_text())
    hardening = EDGE_UNIT.read_text().split("# Hardening", 1)[1]
    # the edge's own paths (its config, its console record, its state) are not the node's
    own_paths = ("ReadOnlyPaths", "RuntimeDirectory", "StateDirectory")
    keys = [k for k in directives(hardening) if k not in own_paths]
    assert len(keys) > 15, keys
    missing = {k: edge[k] for k in keys if node.get(k) != edge[k]}
    assert not missing, f"the node's unit lacks the edge's hardening: {missing}"
    assert node["StateDirectory"] == ["iop-node"]


def test_systemd_analyze_accepts_the_unit(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed on this machine")
    local = tmp_path / "iop-node.service"
    local.write_text(UNIT.read_text().replace("/opt/iop-edge/bin/iop-node", iop_node()))
    verify = subprocess.run(
        ["systemd-analyze", "verify", str(local)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert verify.returncode == 0, verify.stderr
    assert "iop-node.service" not in verify.stderr, verify.stderr
