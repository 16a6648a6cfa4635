"""``python -m iop_edge`` (issue 15): the command line without the console script — what a
container or a plain ``python`` runs — including a daemon started that way handing over to a
successor started the same way. Real subprocesses."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from iop_edge import __version__
from iop_edge.runtime_record import record_name
from tests.helpers import BOUND, ROOT, doc_for, dump

MODULE = [sys.executable, "-m", "iop_edge"]


def module(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MODULE, *args], capture_output=True, text=True, timeout=60, check=False, cwd=cwd
    )


def test_python_m_iop_edge_is_the_command_line(tmp_path):
    version = module("--version", cwd=tmp_path)
    assert (version.returncode, version.stdout.strip()) == (0, f"iop-edge {__version__}")
    shipped = str(ROOT / "configs/edge.yaml")
    valid = module("config", "validate", "--config", shipped, cwd=tmp_path)
    assert (valid.returncode, valid.stdout.strip()) == (0, f"{shipped}: valid")
    usage = module("nonsense", cwd=tmp_path)
    assert usage.returncode == 2
    assert usage.stderr.startswith("usage: iop-edge")


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_daemon_run_as_python_m_restarts_as_python_m_and_keeps_its_record(tmp_path):
    """``python -m iop_edge serve`` outside systemd: the thin parent starts the server with its
    own command — the interpreter with ``-m iop_edge``, not the path of ``__main__.py`` — and
    ``iop-edge restart`` runs the server's command again for the successor. The parent stays;
    the successor's console record replaces the old server's, which that one leaves in place
    as it exits; SIGTERM to the parent stops the successor, which removes its record, and the
    parent exits 0."""
    config = tmp_path / "edge.yaml"
    config.write_text(dump(doc_for(logging={"format": "json"})))
    record = Path(os.environ["XDG_RUNTIME_DIR"]) / "iop-edge" / record_name(config)
    command = [*MODULE, "serve", "--config", str(config)]
    parent = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert parent.stderr is not None
        for line in parent.stderr:
            if json.loads(line)["event"] == "listening":
                break
        first = json.loads(record.read_text())["pid"]
        assert first != parent.pid
        assert cmdline(first) == command
        restarted = module("restart", "--config", str(config), "--json")
        assert restarted.returncode == 0, restarted.stderr
        answer = json.loads(restarted.stdout)
        assert answer["result"] == "handed_over"
        new_pid = answer["pid"]
        assert cmdline(new_pid) == command
        deadline = time.monotonic() + BOUND
        while not gone(first) and time.monotonic() < deadline:
            time.sleep(0.05)  # (the parent reaps it: no wait() of ours to block on)
        assert gone(first)
        assert parent.poll() is None
        assert json.loads(record.read_text())["pid"] == new_pid
        status = module("status", "--config", str(config), "--json")
        assert json.loads(status.stdout)["pid"] == new_pid
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(BOUND) == 0
        assert gone(new_pid)
        assert not record.exists()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(parent.pid, signal.SIGKILL)  # what the test left running
        parent.wait()
        assert parent.stderr is not None
        parent.stderr.close()
