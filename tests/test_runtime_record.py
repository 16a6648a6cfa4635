"""How the command line finds a running daemon's admin API (issue 15): the console address the
daemon records in its runtime directory, and what ``status`` / ``config refresh`` say when
``--config FILE`` does not load. Real ``iop-edge serve`` processes, real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from iop_edge.cli import main
from iop_edge.runtime_record import find_record, record_name, runtime_directories, write_record
from tests.helpers import BOUND, IOP_EDGE, doc_for, dump, edge_on, wait_for


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "IOP_EDGE_ADMIN_TOKEN"}
    environment.update(env or {})
    return subprocess.run(
        [IOP_EDGE, *args], capture_output=True, text=True, env=environment, timeout=60, check=False
    )


def write_config(path: Path, **root: Any) -> Path:
    path.write_text(dump(doc_for(logging={"format": "json"}, **root)))
    return path


@contextlib.contextmanager
def serving(config: Path) -> Iterator[tuple[subprocess.Popen[str], dict[str, Any]]]:
    """``iop-edge serve --config CONFIG``, the server alone (the record holds its pid);
    yields it and its ``listening`` event."""
    process = subprocess.Popen(
        [IOP_EDGE, "serve", "--config", str(config), "--no-parent"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        for line in process.stderr:
            event = json.loads(line)
            if event["event"] == "listening":
                yield process, event
                break
        else:
            raise AssertionError("the daemon exited without logging 'listening'")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stderr is not None
        process.stderr.close()


def stop(process: subprocess.Popen[str]) -> int:
    process.send_signal(signal.SIGTERM)
    return process.wait(BOUND)


def record_file(config: Path) -> Path:
    return Path(os.environ["XDG_RUNTIME_DIR"]) / "iop-edge" / record_name(config)


def default_console_is_free() -> bool:
    """Nothing answers on the default console address (127.0.0.1:7601) of this machine."""
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", 7601)) != 0


def test_status_finds_a_daemon_on_port_0_through_its_record_even_once_its_file_breaks(tmp_path):
    """The console listens on port 0: only the record knows where. Two daemons on two config
    files keep two records; each goes when its daemon exits, and the CLI then says it falls
    back to the default address because the file does not load."""
    first = write_config(tmp_path / "a.yaml")
    second = write_config(tmp_path / "b.yaml")
    with serving(first) as (one, listening_one), serving(second) as (two, _):
        assert listening_one["config_watch"] is True
        recorded = json.loads(record_file(first).read_text())
        assert recorded["console"] == listening_one["console"]
        assert (recorded["pid"], recorded["config"]) == (one.pid, str(first.resolve()))
        for config, process in ((first, one), (second, two)):
            status = cli("status", "--config", str(config), "--json")
            assert (status.returncode, status.stderr) == (0, "")
            assert json.loads(status.stdout)["pid"] == process.pid
        first.write_text("models: [\n")  # the file breaks: the record still leads to the daemon
        status = cli("status", "--config", str(first))
        assert (status.returncode, status.stderr) == (0, "")
        assert f"(pid {one.pid})" in status.stdout.splitlines()[0]
        judged = cli("config", "refresh", "--config", str(first), "--json")
        assert judged.returncode == 1
        assert "YAML syntax error" in json.loads(judged.stdout)["errors"][0]["message"]
        assert stop(one) == 0
        assert not record_file(first).exists()
        assert record_file(second).exists()
        gone = cli("status", "--config", str(first))
        assert gone.returncode == 1
        assert gone.stderr.splitlines()[0] == (
            f"iop-edge status: the config {first} does not load ({first}:2:1: YAML syntax "
            "error: while parsing a flow node did not find expected node content) and no running "
            "daemon recorded an admin address for it; trying the default 127.0.0.1:7601 (pass "
            "--console URL, or --config the daemon's file)"
        )
        if default_console_is_free():
            assert (
                "cannot reach the admin API at http://127.0.0.1:7601/admin/status "
                "(the default console.listen)" in gone.stderr
            )
        assert stop(two) == 0
        assert not record_file(second).exists()


def test_without_a_record_the_cli_names_where_the_address_came_from(tmp_path):
    """No daemon: the address of ``console.listen`` is tried and named as such; a disabled
    console is said plainly; an address that is not one falls back to the default, said."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    config = write_config(tmp_path / "edge.yaml", console={"listen": f"127.0.0.1:{port}"})
    result = cli("status", "--config", str(config))
    assert result.returncode == 1
    assert result.stderr.startswith(
        f"iop-edge status: cannot reach the admin API at http://127.0.0.1:{port}/admin/status "
        f"(console.listen in {config}): "
    )
    refresh = cli("config", "refresh", "--config", str(config))
    assert refresh.returncode == 1
    assert f"(console.listen in {config})" in refresh.stderr
    assert "use --offline RUNNING.yaml" in refresh.stderr
    disabled = write_config(tmp_path / "off.yaml", console={"enabled": False})
    for command in (("status",), ("restart",), ("config", "refresh")):
        result = cli(*command, "--config", str(disabled))
        assert result.returncode == 1
        assert result.stderr == (
            f"iop-edge {' '.join(command)}: console.enabled is false in {disabled}: its daemon "
            "has no admin API to ask (pass --console URL if another one has)\n"
        )
    odd = tmp_path / "odd.yaml"
    odd.write_text("console: {listen: nowhere}\n")
    result = cli("status", "--config", str(odd))
    assert result.stderr.splitlines()[0] == (
        f"iop-edge status: console.listen in {odd} is not an address ('nowhere'); trying the "
        "default 127.0.0.1:7601 (pass --console URL)"
    )


def test_a_record_is_believed_only_from_a_safe_place_and_a_live_process(tmp_path):
    """The CLI sends the admin token to the recorded address: a record in a directory others
    may write to, a group-writable record, one of a dead process or of another config file is
    ignored."""
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "run")}
    (tmp_path / "run").mkdir(mode=0o700)
    config = write_config(tmp_path / "edge.yaml")
    assert runtime_directories(env)[0] == tmp_path / "run" / "iop-edge"
    path = write_record(config, "http://127.0.0.1:1", env)
    assert path.parent == tmp_path / "run" / "iop-edge"
    assert (path.parent.stat().st_mode & 0o777, path.stat().st_mode & 0o777) == (0o755, 0o644)
    found = find_record(config, env)
    assert found is not None
    assert (found.console, found.pid) == ("http://127.0.0.1:1", os.getpid())
    assert find_record(tmp_path / "other.yaml", env) is None
    path.chmod(0o664)
    assert find_record(config, env) is None
    path.chmod(0o644)
    path.parent.chmod(0o777)
    assert find_record(config, env) is None
    path.parent.chmod(0o755)
    data = json.loads(path.read_text())
    exited = subprocess.Popen(["true"])
    exited.wait()
    path.write_text(json.dumps({**data, "pid": exited.pid}))
    assert find_record(config, env) is None
    path.write_text(json.dumps(data))
    assert find_record(config, env) is not None


async def test_reload_watch_false_starts_no_watcher_and_says_so(tmp_path, log_stream):
    """``reload.watch: false``: no watch or poll task runs, status says the file is not
    watched, and SIGHUP / the admin API still refresh."""
    async with edge_on(tmp_path, doc_for(reload={"watch": False})) as edge:
        names = {task.get_name() for task in asyncio.all_tasks()}
        assert "refresh-worker" in names
        assert not names & {"config-watch", "config-poll"}
        assert edge.supervisor.statistics().as_status()["watch"] is False
        edge.path.write_text(dump(doc_for(capacity=5, reload={"watch": False})))
        edge.supervisor.request("signal")  # what the daemon's SIGHUP handler does
        record = await edge.next_record()
        assert (record.trigger, record.result.result) == ("signal", "applied")
        assert edge.capacity() == 5
    async with edge_on(tmp_path, doc_for()) as edge:
        names = {task.get_name() for task in asyncio.all_tasks()}
        assert {"config-watch", "config-poll"} <= names
        assert edge.supervisor.statistics().as_status()["watch"] is True
    listening = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    watched = [e["config_watch"] for e in listening if e["event"] == "listening"]
    assert watched == [False, True]


def test_status_of_a_daemon_that_does_not_watch_its_file_says_so(tmp_path):
    config = write_config(tmp_path / "edge.yaml", reload={"watch": False})
    with serving(config) as (process, listening):
        assert listening["config_watch"] is False
        status = cli("status", "--config", str(config))
        assert status.returncode == 0, status.stderr
        assert status.stdout.splitlines()[2] == (
            "config file not watched (reload.watch: false): refresh with SIGHUP (systemctl "
            "reload) or iop-edge config refresh --apply"
        )
        write_config(config, reload={"watch": False}, provider_pool={"max_queue": 3})
        process.send_signal(signal.SIGHUP)

        async def refreshed() -> bool:
            status = await asyncio.to_thread(cli, "status", "--config", str(config), "--json")
            return json.loads(status.stdout)["config"]["last_refresh"] is not None

        asyncio.run(wait_for(refreshed))
        status = json.loads(cli("status", "--config", str(config), "--json").stdout)
        assert status["config"]["watch"] is False
        assert status["config"]["last_refresh"]["trigger"] == "signal"
        assert status["queue"]["max_queue"] == 3
        assert stop(process) == 0


@pytest.mark.parametrize("watch", ["yes", 0])
def test_reload_watch_takes_a_boolean_only(tmp_path, watch):
    config = write_config(tmp_path / "edge.yaml", reload={"watch": watch})
    result = cli("config", "validate", str(config))
    assert result.returncode == 1
    assert result.stderr.startswith(f"reload.watch: {watch!r} is invalid")


async def test_the_cli_in_this_process_finds_an_edge_through_its_record(tmp_path, capsys):
    """The same lookups, with ``iop_edge.cli.main`` called in this process (its console on
    port 0: only the record knows where): status, a candidate's dry run, and the fallback once
    the daemon is gone and the file does not load."""
    async with edge_on(tmp_path, doc_for()) as edge:
        path = str(edge.path)
        assert await asyncio.to_thread(main, ["status", "--config", path, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["config"]["path"] == path
        candidate = tmp_path / "candidate.yaml"
        candidate.write_text(dump(doc_for(capacity=3)))
        code = await asyncio.to_thread(
            main, ["config", "refresh", "--config", path, "--candidate", str(candidate)]
        )
        assert code == 0
        assert capsys.readouterr().out.startswith("result: would apply (dry run")
        assert edge.capacity() == 2
    edge.path.write_text("{")
    code = await asyncio.to_thread(
        main, ["status", "--config", str(edge.path), "--console", "http://127.0.0.1:1"]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith("iop-edge status: cannot reach the admin API at http://127.0.0.1:1")
    assert "(--console)" in err
    # (a GET: whatever may listen on the default address of this machine is only asked)
    await asyncio.to_thread(main, ["status", "--config", str(edge.path)])
    assert capsys.readouterr().err.startswith(
        f"iop-edge status: the config {edge.path} does not load ("
    )
