"""Daemon operations: sd_notify, SIGTERM drain, SIGHUP, start-up failures, deploy files."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import re
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from iop_edge.daemon import GC_THRESHOLDS
from iop_edge.runtime.systemd import Notifier
from iop_edge.runtime_record import record_name
from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers import IOP_EDGE, ROOT, doc_for, dump, edge_on, rename_save


class NotifySocket:
    """A stand-in for systemd's notify socket: a bound Unix datagram socket."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setblocking(False)

    async def next(self) -> dict[str, str]:
        raw = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(self.sock, 65536), 15)
        return dict(line.split("=", 1) for line in raw.decode().splitlines())

    async def next_with(self, key: str) -> dict[str, str]:
        while True:
            message = await self.next()
            if key in message:
                return message


async def test_sd_notify_sequence_ready_reloading_watchdog_stopping(tmp_path):
    (tmp_path / "run").mkdir()
    systemd = NotifySocket(tmp_path / "run" / "notify")
    notifier = Notifier({"NOTIFY_SOCKET": str(systemd.path), "WATCHDOG_USEC": "200000"})
    assert notifier.watchdog_interval == 0.1  # half of WatchdogSec, as systemd advises
    config_dir = tmp_path / "etc"
    config_dir.mkdir()
    try:
        async with edge_on(config_dir, doc_for(), notifier=notifier) as edge:
            ready = await systemd.next_with("READY")
            assert ready["READY"] == "1"
            assert ready["STATUS"].startswith(f"serving config {edge.supervisor.running_hash[:12]}")
            await systemd.next_with("WATCHDOG")  # pings come from the event loop
            rename_save(edge.path, dump(doc_for(capacity=3, logging={"level": "debug"})))
            reloading = await systemd.next_with("RELOADING")
            assert int(reloading["MONOTONIC_USEC"]) > 0
            after = await systemd.next_with("READY")
            assert after["STATUS"].endswith("1 change(s) need a restart")
            bad = doc_for()
            bad["provider_pool"]["max_queue"] = -1
            rename_save(edge.path, dump(bad))
            await systemd.next_with("RELOADING")
            rejected = await systemd.next_with("READY")
            assert (
                "last reload rejected: provider_pool.max_queue: -1 is negative"
                in rejected["STATUS"]
            )
        stopping = await systemd.next_with("STOPPING")
        assert stopping["STOPPING"] == "1"
    finally:
        systemd.sock.close()


def test_without_notify_socket_notifications_do_nothing():
    notifier = Notifier({})
    assert not notifier.enabled
    assert notifier.watchdog_interval is None
    notifier.ready("x")  # no socket, no error


@contextlib.contextmanager
def daemon_process(config: Path) -> Iterator[tuple[subprocess.Popen[str], dict[str, Any]]]:
    """Run `iop-edge serve` as systemd would; yield it and its ``listening`` event (the
    listeners' URLs by name); kill it if the test left it running."""
    process = subprocess.Popen(
        [IOP_EDGE, "serve", "--config", str(config), "--drain-timeout", "20"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield process, wait_for_line(process, "listening")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stderr is not None
        process.stderr.close()


def wait_for_line(process: subprocess.Popen[str], event_name: str) -> dict[str, Any]:
    """Read the daemon's log until the event ``event_name``; return it (a JSON object)."""
    assert process.stderr is not None
    for line in process.stderr:
        event: dict[str, Any] = json.loads(line)
        if event["event"] == event_name:
            return event
    raise AssertionError(f"the daemon exited without logging {event_name!r}")


async def test_sigterm_lets_an_in_flight_stream_finish_then_exits_0(tmp_path):
    async with FakeOpenAI(behavior=FakeBehavior(hold=True, chunks=5)) as fake:
        config = tmp_path / "edge.yaml"
        config.write_text(dump(doc_for(fake, logging={"format": "json"})))
        with daemon_process(config) as (process, addresses):
            async with aiohttp.ClientSession() as session:

                async def stream() -> tuple[int, str]:
                    async with session.post(
                        addresses["openai"] + "/v1/chat/completions",
                        json={
                            "model": "chat",
                            "stream": True,
                            "messages": [{"role": "user", "content": "one two three four five"}],
                        },
                    ) as response:
                        return response.status, await response.text()

                call = asyncio.create_task(stream())
                await fake.wait_in_flight(1)
                process.send_signal(signal.SIGTERM)  # drain starts while the request runs
                await asyncio.to_thread(wait_for_line, process, "draining")
                fake.release()
                status, body = await call
            assert status == 200
            assert body.rstrip().endswith("data: [DONE]")
            assert body.count("chat.completion.chunk") >= 5
            assert await asyncio.to_thread(process.wait, 20) == 0
            assert process.stderr is not None
            events = [json.loads(line)["event"] for line in process.stderr]
            assert events[-1] == "stopped"


def test_sighup_at_any_time_never_kills_the_daemon(tmp_path):
    config = tmp_path / "edge.yaml"
    config.write_text(dump(doc_for(logging={"format": "json"})))
    with daemon_process(config) as (process, _):
        for _ in range(3):
            process.send_signal(signal.SIGHUP)
        refresh = wait_for_line(process, "config_refresh")
        assert (refresh["trigger"], refresh["result"]) == ("signal", "applied")
        assert process.poll() is None
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0


@pytest.mark.parametrize("content", [None, "models: [\n", "nodes: []\n"])
def test_a_bad_or_missing_config_at_start_exits_1_with_the_errors(tmp_path, content):
    config = tmp_path / "edge.yaml"
    if content is not None:
        config.write_text(content)
    result = subprocess.run(
        [IOP_EDGE, "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert f"the config {config} is not valid" in result.stderr
    expected = {
        None: "cannot read config",
        "models: [\n": "YAML syntax error",
        "nodes: []\n": "nothing to serve",
    }[content]
    assert expected in result.stderr


@pytest.mark.parametrize("listener", ["openai", "metrics", "console"])
def test_a_port_in_use_is_one_line_naming_the_listener_and_address_and_exit_1(tmp_path, listener):
    """Another process holds the port of one listener: ``serve`` says which listener, which
    address and why in one line, exits 1, shows no traceback, and leaves no record."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        config = tmp_path / "edge.yaml"
        doc = doc_for(logging={"format": "json"})
        doc[listener] = {"listen": f"127.0.0.1:{port}"}
        config.write_text(dump(doc))
        result = subprocess.run(
            [IOP_EDGE, "serve", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    plain = [line for line in result.stderr.splitlines() if not line.startswith("{")]
    assert plain == [
        f"iop-edge serve: the {listener} listener cannot listen on 127.0.0.1:{port} "
        f"({listener}.listen): the address is already in use: another process listens there "
        f"(`ss -ltnp 'sport = :{port}'` names it)"
    ]
    events = [json.loads(line)["event"] for line in result.stderr.splitlines() if line[:1] == "{"]
    assert "listening" not in events
    assert not (Path(os.environ["XDG_RUNTIME_DIR"]) / "iop-edge" / record_name(config)).exists()


def test_the_unit_file_passes_systemd_analyze_verify(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed on this machine")
    unit = (ROOT / "deploy/iop-edge.service").read_text()
    assert "Type=notify" in unit
    assert "ExecReload=/bin/kill -HUP $MAINPID" in unit
    # verify checks that ExecStart exists: point it at this checkout's iop-edge
    local = tmp_path / "iop-edge.service"
    local.write_text(unit.replace("/opt/iop-edge/bin/iop-edge", IOP_EDGE))
    result = subprocess.run(
        ["systemd-analyze", "verify", str(local)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "iop-edge.service" not in result.stderr  # no warning about our unit


def test_the_alert_rules_cover_the_operational_failures():
    """Every failure an operator must hear of has an alert, on the metric that shows it; the
    provider error rate divides a provider's own failures by its own attempts (issue 15), and
    each alert is proven to fire and stay quiet by ``alerts.test.yml``
    (tests/test_alert_rules.py runs it with promtool)."""
    rules = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"]}
    assert set(alerts) == {
        "IopEdgeDown",
        "IopEdgeAbsent",
        "IopEdgeReloadFailing",
        "IopEdgeRestartPending",
        "IopEdgeQueueSaturated",
        "IopEdgeQueueTimeoutsRising",
        "IopEdgeProviderErrorRate",
        "IopEdgeProviderDown",
        "IopEdgeModelNoProvider",
        "IopEdgeModelPanic",
        "IopEdgeTimeToFirstTokenHigh",
        "IopEdgeRemoteNodeDown",
        "IopEdgeRemoteNodeFlapping",
        "IopEdgeSharedStoreDown",
    }
    assert alerts["IopEdgeRestartPending"]["for"] == "1h"
    assert alerts["IopEdgeProviderDown"]["for"] == "5m"
    expected = {
        "IopEdgeDown": 'up{job="iop-edge"} == 0',
        "IopEdgeAbsent": 'absent(up{job="iop-edge"})',
        "IopEdgeReloadFailing": "iop_edge_config_last_reload_successful",
        "IopEdgeRestartPending": "iop_edge_config_restart_pending",
        "IopEdgeQueueSaturated": "iop_edge_admission_rejected_total",
        "IopEdgeQueueTimeoutsRising": 'reason="queue_timeout"',
        "IopEdgeProviderDown": "iop_edge_provider_up",
        "IopEdgeModelNoProvider": "iop_edge_model_enabled_providers == 0",
        "IopEdgeModelPanic": "iop_edge_model_panic",
        "IopEdgeTimeToFirstTokenHigh": "iop_edge_time_to_first_token_seconds_bucket",
        "IopEdgeRemoteNodeDown": "iop_edge_node_connected == 0",
        "IopEdgeRemoteNodeFlapping": "iop_edge_node_reconnects_total",
        "IopEdgeSharedStoreDown": "iop_edge_shared_store_up == 0",
    }
    for name, fragment in expected.items():
        assert fragment in alerts[name]["expr"], name
    error_rate = alerts["IopEdgeProviderErrorRate"]["expr"]
    numerator, denominator = error_rate.split("\n/ ")
    assert 'iop_edge_provider_requests_total{code=~"upstream_error|upstream_timeout"}' in numerator
    assert "sum by (instance, node, provider) (rate(iop_edge_provider_requests_total[5m]))" in (
        denominator
    )
    # the scrape job the edge-down alerts name is the one the shipped scrape config defines
    scrape = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    assert [job["job_name"] for job in scrape["scrape_configs"]] == ["iop-edge"]
    if shutil.which("promtool"):
        subprocess.run(
            ["promtool", "check", "rules", str(ROOT / "deploy/prometheus/alerts.yml")],
            check=True,
            timeout=60,
        )


SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASS|CREDENTIALS?)$", re.IGNORECASE)
PLACEHOLDER = re.compile(r"^$|replace-me|change-me|example|<[^>]*>", re.IGNORECASE)
TOKEN_SHAPED = re.compile(r"\b(sk-[A-Za-z0-9_-]{16,}|[A-Za-z0-9_+/=-]{32,})")


def real_looking_secrets(text: str) -> list[str]:
    """The lines of an env file that look like they hold a real secret: a secret-named
    variable whose value is not an obvious placeholder, or a token-shaped string (an
    ``sk-...`` key, or 32+ characters of key alphabet) anywhere, comments included."""
    found = []
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        assigned = sep and not line.lstrip().startswith("#")
        secret_named = assigned and SECRET_NAME.search(name.strip())
        if (secret_named and not PLACEHOLDER.search(value.strip())) or TOKEN_SHAPED.search(line):
            found.append(line)
    return found


def test_the_env_example_holds_no_real_secret():
    text = (ROOT / "deploy/iop-edge.env.example").read_text()
    assert "OPENAI_API_KEY=sk-replace-me" in text  # the placeholder the README tells to replace
    assert real_looking_secrets(text) == []
    # The check can fail: the same file with a real-looking value in place of the placeholder.
    key = "sk-proj-" + "Ab3dE5gH7jK9mN1pQ3sT5vX7z" * 2
    for doctored, line in [
        (text.replace("sk-replace-me", key), f"OPENAI_API_KEY={key}"),
        (text.replace("sk-replace-me", "hunter2"), "OPENAI_API_KEY=hunter2"),
        (text + f"# old key: {key}\n", f"# old key: {key}"),
        (text + "ADMIN_TOKEN=4f1c9b2e\n", "ADMIN_TOKEN=4f1c9b2e"),
    ]:
        assert real_looking_secrets(doctored) == [line]


async def test_serve_freezes_what_start_up_built_and_raises_the_collectors_thresholds(tmp_path):
    """``serve`` (``freeze_gc``): what start-up built leaves the collector's reach, and young
    collections come 70 times less often (GC_THRESHOLDS: the tail under a deep queue)."""
    before = gc.get_threshold()
    try:
        async with edge_on(tmp_path, doc_for(), freeze_gc=True):
            assert gc.get_threshold() == GC_THRESHOLDS == (50_000, 20, 20)
            assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
