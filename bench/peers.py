"""The processes a proxy benchmark runs, and how they are started, pinned, measured and stopped.

- :class:`BenchProcess`: one subprocess in its own process group, optionally pinned to CPU
  cores with ``taskset``, its output in a log file; :meth:`BenchProcess.stop` ends the whole
  group (SIGTERM, SIGKILL after a grace period). :func:`tree_rss_kib` and
  :func:`tree_cpu_seconds` measure the process and its descendants (``/proc``, and each
  process's CPU-time clock, in nanoseconds).
- :class:`ProcessSet`: every process started so far, stopped in reverse order on exit (also on
  Ctrl-C and errors), so a benchmark never leaves anything behind.
- Launchers for each target: the fake upstream (:func:`start_fake`), ``iop-edge serve`` on a
  generated config (:func:`edge_config`, :func:`start_edge`; with a remote node,
  :func:`with_remote_node`, served by ``iop-node``: :func:`start_node`), the bare pass-through
  (:func:`start_passthrough`) and LiteLLM proxy (:func:`start_litellm`, skipped with a reason
  when ``bench/.venv-litellm`` is missing or it does not come up).

Everything listens on 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Protocol, Self

import yaml

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
VENV_BIN = Path(sys.executable).parent
LITELLM_VENV = BENCH / ".venv-litellm"
LITELLM_BIN = LITELLM_VENV / "bin" / "litellm"
MODEL = "bench-model"
"""The model name every target is asked for (an iop-edge model group, a LiteLLM model_name)."""
NATIVE_MODEL = "bench-native"
"""The model group of :func:`edge_config`'s ``native_group``: a provider that passes Anthropic
Messages and OpenAI Responses through (``native_apis: [messages, responses]``)."""

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def have_taskset() -> bool:
    """Whether ``taskset`` exists and this machine has at least two cores to split."""
    return shutil.which("taskset") is not None and len(os.sched_getaffinity(0)) >= 2


def _raise_fd_limit() -> None:
    # Runs in the child before exec: the 10,000-pending run holds >10,000 sockets per process.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else 65536
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(target, 65536), hard))
    os.setpgrp()  # own process group: stop() can end the process and all of its children


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                text = Path(f"/proc/{pid}/task/{task}/children").read_text()
                found.extend(int(child) for child in text.split())
    return found


def process_tree(pid: int) -> list[int]:
    """``pid`` and every descendant still alive."""
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        if os.path.exists(f"/proc/{current}"):
            tree.append(current)
            todo.extend(_children(current))
    return tree


def tree_rss_kib(pid: int) -> int:
    """Sum of VmRSS (KiB) over ``pid`` and its descendants (0 when gone)."""
    total = 0
    for member in process_tree(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{member}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds used so far by process ``pid`` (every thread, exited ones too), or 0.

    Read from the kernel's CPU-time clock of the process (``clock_getcpuclockid``: the clock id
    ``~pid << 3 | CPUCLOCK_SCHED``), which counts nanoseconds; ``/proc/<pid>/stat`` (utime +
    stime, the same time in clock ticks of 10 ms) only where that clock cannot be read. A 10 ms
    tick is a few per cent of a one-second cell, more than the differences measured.
    """
    try:
        return time.clock_gettime(((~pid) << 3) | 2)
    except OSError:
        pass
    with contextlib.suppress(OSError, IndexError, ValueError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime (fields 14, 15)
    return 0.0


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by ``pid`` and its live descendants."""
    return sum(process_cpu_seconds(member) for member in process_tree(pid))


class CpuMeasured(Protocol):
    """Something whose CPU time is read over a cell: a :class:`BenchProcess`, or a process a
    harness of its own started (the shared store's ``redis-server``)."""

    def cpu_seconds(self) -> float:
        """CPU seconds used so far."""
        ...


@dataclass
class BenchProcess:
    """A subprocess in its own process group, pinned with taskset when ``cores`` is given."""

    name: str
    argv: Sequence[str]
    log_path: Path
    cores: str | None = None
    env: dict[str, str] | None = None
    stdout_pipe: bool = False
    popen: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _log: IO[bytes] | None = field(default=None, init=False)

    @property
    def command(self) -> list[str]:
        """The argv actually run (with the taskset prefix when pinned)."""
        prefix = ["taskset", "-c", self.cores] if self.cores is not None else []
        return [*prefix, *self.argv]

    def start(self) -> Self:
        """Start the process; its stderr (and stdout unless piped) go to ``log_path``."""
        self._log = self.log_path.open("wb")
        self.popen = subprocess.Popen(
            self.command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if self.stdout_pipe else self._log,
            stderr=self._log,
            env={**os.environ, **(self.env or {})},
            cwd=ROOT,
            preexec_fn=_raise_fd_limit,
        )
        return self

    @property
    def pid(self) -> int:
        """The process id (taskset execs the program, so it is the program's pid)."""
        if self.popen is None:
            raise RuntimeError(f"{self.name} is not started")
        return self.popen.pid

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self.popen is not None and self.popen.poll() is None

    def read_line(self, timeout: float) -> str:
        """Read one stdout line (needs ``stdout_pipe``) within ``timeout`` seconds."""
        assert self.popen is not None
        assert self.popen.stdout is not None
        import selectors

        with selectors.DefaultSelector() as selector:
            selector.register(self.popen.stdout, selectors.EVENT_READ)
            if not selector.select(timeout):
                raise TimeoutError(f"{self.name} printed nothing within {timeout:.0f} s")
        return self.popen.stdout.readline().decode().strip()

    def log_tail(self, limit: int = 1500) -> str:
        """The end of the process's log, for error messages."""
        with contextlib.suppress(OSError):
            return self.log_path.read_bytes()[-limit:].decode(errors="replace")
        return ""

    def rss_kib(self) -> int:
        """Resident memory of the process tree, KiB."""
        return tree_rss_kib(self.pid) if self.alive() else 0

    def cpu_seconds(self) -> float:
        """CPU seconds used so far by the process tree."""
        return tree_cpu_seconds(self.pid) if self.alive() else 0.0

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds; idempotent."""
        popen = self.popen
        if popen is None:
            return
        if popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGTERM)
            try:
                popen.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(popen.pid, signal.SIGKILL)
                popen.wait(5)
        # A daemon may leave children in its group after it exits: end them too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(popen.pid, signal.SIGKILL)
        if popen.stdout is not None:
            popen.stdout.close()
        if self._log is not None:
            self._log.close()
            self._log = None


class ProcessSet:
    """Every process a benchmark started; all are stopped (newest first) on exit."""

    def __init__(self) -> None:
        self._processes: list[BenchProcess] = []

    def start(self, process: BenchProcess) -> BenchProcess:
        """Start ``process`` and remember it."""
        self._processes.append(process)
        return process.start()

    def stop(self, process: BenchProcess) -> None:
        """Stop one process now."""
        process.stop()
        with contextlib.suppress(ValueError):
            self._processes.remove(process)

    def stop_all(self) -> None:
        """Stop every remaining process, newest first."""
        while self._processes:
            self._processes.pop().stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop_all()


def wait_http(
    url: str, process: BenchProcess, timeout: float, headers: dict[str, str] | None = None
) -> None:
    """Poll ``url`` until it answers 2xx; raise if the process dies or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        if not process.alive():
            raise RuntimeError(f"{process.name} exited early:\n{process.log_tail()}")
        try:
            request = urllib.request.Request(url, headers=headers or {})
            with urllib.request.urlopen(request, timeout=2) as response:
                if 200 <= response.status < 300:
                    return
                last = f"HTTP {response.status}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.1)
    raise TimeoutError(f"{process.name} not ready at {url} after {timeout:.0f} s ({last})")


@dataclass(frozen=True)
class Target:
    """A running thing to send load to: base URL (``.../v1``), bearer token and its process."""

    name: str
    base_url: str
    process: BenchProcess | None
    token: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


def start_fake(
    processes: ProcessSet, workdir: Path, cores: str | None, behavior: str = "chunks=16"
) -> Target:
    """Start the fake OpenAI upstream (``iop_edge.testing.fake_openai``) and read its URL."""
    process = processes.start(
        BenchProcess(
            "fake-upstream",
            [
                sys.executable,
                "-m",
                "iop_edge.testing.fake_openai",
                "--port",
                "0",
                "--behavior",
                behavior,
                "--model",
                MODEL,
            ],
            workdir / "fake-upstream.log",
            cores=cores,
            stdout_pipe=True,
        )
    )
    base_url = process.read_line(timeout=30)
    if not base_url.startswith("http://127.0.0.1:"):
        raise RuntimeError(f"fake upstream printed {base_url!r}:\n{process.log_tail()}")
    return Target("direct", base_url, process, detail={"behavior": behavior})


def new_principal_token() -> tuple[str, str]:
    """A random bearer token and its SHA-256 hex digest (what the config stores)."""
    token = "iop-bench-" + secrets.token_urlsafe(24)
    return token, hashlib.sha256(token.encode()).hexdigest()


def edge_config(
    upstream: str,
    *,
    port: int,
    token_hash: str,
    log_level: str = "info",
    providers: int = 1,
    capacity: int = 1024,
    max_queue: int = 100_000,
    held_group: bool = False,
    native_group: bool = False,
) -> dict[str, Any]:
    """An iop-edge config: ``providers`` openai_compat providers on the fake, in group MODEL.

    Auth is on (one principal token), metrics on (on a free port; the listener may not exist
    yet), the console off. ``held_group`` adds a model group ``bench-held`` served by one
    provider of capacity 1 on the same upstream, used to park pending requests in the queue.
    ``native_group`` adds the group :data:`NATIVE_MODEL`: one provider like the others on the
    same upstream (target MODEL) but with ``native_apis: [messages, responses]``, so that a
    Messages or Responses request to it is passed through where one to MODEL is translated to
    chat.
    """
    provider_ids = [f"p{index:04d}" for index in range(providers)]
    provider_entries: list[dict[str, Any]] = [
        {
            "id": pid,
            "type": "openai_compat",
            "category": "local_inference",
            "adapter": "fake",
            "models": [MODEL],
            "capacity": capacity,
        }
        for pid in provider_ids
    ]
    models: list[dict[str, Any]] = [
        {"id": MODEL, "context_window_tokens": 131072, "providers": provider_ids}
    ]
    if held_group:
        provider_entries.append(
            {
                "id": "held",
                "type": "openai_compat",
                "category": "local_inference",
                "adapter": "fake",
                "models": [MODEL],
                "capacity": 1,
            }
        )
        models.append(
            {
                "id": "bench-held",
                "context_window_tokens": 131072,
                "providers": [{"id": "held", "target": MODEL}],
            }
        )
    if native_group:
        provider_entries.append(
            {
                "id": "native",
                "type": "openai_compat",
                "category": "local_inference",
                "adapter": "fake",
                "models": [MODEL],
                "capacity": capacity,
                "native_apis": ["messages", "responses"],
            }
        )
        models.append(
            {
                "id": NATIVE_MODEL,
                "context_window_tokens": 131072,
                "providers": [{"id": "native", "target": MODEL}],
            }
        )
    return {
        "edge": {"id": "edge-bench"},
        "logging": {"level": log_level, "format": "json"},
        "metrics": {"enabled": True, "listen": f"127.0.0.1:{free_port()}"},
        "console": {"enabled": False},
        "openai": {
            "listen": f"127.0.0.1:{port}",
            "principal_tokens": [
                {
                    "token_ref": "bench",
                    "token_hash_sha256": token_hash,
                    "principal_ref": "bench",
                }
            ],
        },
        "provider_pool": {"max_queue": max_queue, "queue_timeout_ms": 0},
        "models": models,
        "nodes": [
            {
                "id": "bench-node",
                "adapters": [{"name": "fake", "type": "openai_compat", "base_url": upstream}],
                "providers": provider_entries,
            }
        ],
    }


def start_edge(
    processes: ProcessSet,
    workdir: Path,
    cores: str | None,
    config: dict[str, Any],
    token: str,
    name: str = "iop-edge",
) -> Target:
    """Write ``config`` and run ``iop-edge serve --config`` on it; wait for ``/readyz``.

    The config goes in a directory of its own, as in ``/etc/iop-edge``: the daemon watches its
    config's directory, and the log file written next to it would have it re-read the config
    several times a second (about 1 % of a request's CPU under load)."""
    directory = workdir / f"{name}-config"
    directory.mkdir(exist_ok=True)
    path = directory / "edge.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    listen = config["openai"]["listen"]
    process = processes.start(
        BenchProcess(
            name,
            # the server alone: its CPU and memory, not a thin parent's
            [str(VENV_BIN / "iop-edge"), "serve", "--config", str(path), "--no-parent"],
            workdir / f"{name}.log",
            cores=cores,
        )
    )
    wait_http(f"http://{listen}/readyz", process, timeout=60)
    return Target(
        name,
        f"http://{listen}/v1",
        process,
        token=token,
        detail={"config": str(path), "log_level": config["logging"]["level"]},
    )


REMOTE_NODE = "bench-remote"
"""The remote node :func:`with_remote_node` adds (served by an ``iop-node`` subprocess)."""
REMOTE_MODEL = "bench-remote"
"""Its model group: one provider on the remote node, on the same upstream and upstream model as
:data:`MODEL`'s."""


def with_remote_node(
    config: dict[str, Any], upstream: str, *, token_hash: str, capacity: int = 1024
) -> dict[str, Any]:
    """``config`` (from :func:`edge_config`) with the node listener on a free loopback port
    and the remote node :data:`REMOTE_NODE` (``token_hash_sha256``: ``token_hash``): one
    ``openai_compat`` provider on ``upstream`` (target :data:`MODEL`), like the local ones,
    serving the model group :data:`REMOTE_MODEL` alone."""
    config = {**config, "nodes": list(config["nodes"]), "models": list(config["models"])}
    config["listen"] = {"address": f"127.0.0.1:{free_port()}"}
    config["nodes"].append(
        {
            "id": REMOTE_NODE,
            "token_hash_sha256": token_hash,
            "adapters": [{"name": "fake", "type": "openai_compat", "base_url": upstream}],
            "providers": [
                {
                    "id": "remote",
                    "type": "openai_compat",
                    "category": "local_inference",
                    "adapter": "fake",
                    "models": [MODEL],
                    "capacity": capacity,
                }
            ],
        }
    )
    config["models"].append(
        {
            "id": REMOTE_MODEL,
            "context_window_tokens": 131072,
            "providers": [{"id": "remote", "target": MODEL}],
        }
    )
    return config


def start_node(
    processes: ProcessSet,
    workdir: Path,
    cores: str | None,
    config: dict[str, Any],
    token: str,
    timeout: float = 60,
) -> BenchProcess:
    """Run ``iop-node`` against the edge running ``config`` (from :func:`with_remote_node`)
    with ``token`` in a mode-0600 file, as an operator runs it; return once the edge's
    ``iop_edge_node_connected`` says the node is connected (its payload acknowledged)."""
    token_file = workdir / "node-token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    process = processes.start(
        BenchProcess(
            "iop-node",
            [
                str(VENV_BIN / "iop-node"),
                "--edge",
                f"http://{config['listen']['address']}",
                "--token-file",
                str(token_file),
            ],
            workdir / "iop-node.log",
            cores=cores,
        )
    )
    metrics = f"http://{config['metrics']['listen']}/metrics"
    connected = f'iop_edge_node_connected{{node="{REMOTE_NODE}"}} 1.0'
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process.alive():
            raise RuntimeError(f"iop-node exited early:\n{process.log_tail()}")
        with contextlib.suppress(OSError), urllib.request.urlopen(metrics, timeout=2) as answer:
            if connected in answer.read().decode().splitlines():
                return process
        time.sleep(0.1)
    raise TimeoutError(f"iop-node did not connect within {timeout:.0f} s:\n{process.log_tail()}")


def start_passthrough(
    processes: ProcessSet, workdir: Path, cores: str | None, upstream: str
) -> Target:
    """Run ``bench/passthrough.py`` in front of ``upstream``; wait for it to answer."""
    port = free_port()
    origin = upstream.removesuffix("/v1")
    process = processes.start(
        BenchProcess(
            "passthrough",
            [
                sys.executable,
                str(BENCH / "passthrough.py"),
                "--upstream",
                origin,
                "--port",
                str(port),
            ],
            workdir / "passthrough.log",
            cores=cores,
        )
    )
    wait_http(f"http://127.0.0.1:{port}/v1/models", process, timeout=30)
    return Target("passthrough", f"http://127.0.0.1:{port}/v1", process)


def litellm_version() -> str | None:
    """The installed LiteLLM version in ``bench/.venv-litellm``, or None."""
    python = LITELLM_VENV / "bin" / "python"
    if not python.exists():
        return None
    result = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    return result.stdout.strip() or None


def start_litellm(
    processes: ProcessSet, workdir: Path, cores: str | None, upstream: str
) -> Target | str:
    """Run LiteLLM proxy (one worker, no database, master key on) in front of ``upstream``.

    Returns the target, or the reason it is skipped.
    """
    if not LITELLM_BIN.exists():
        return f"{LITELLM_BIN.relative_to(ROOT)} is missing (run `make bench-peers`)"
    version = litellm_version()
    port = free_port()
    master_key = "sk-bench-" + secrets.token_hex(12)
    config = {
        "model_list": [
            {
                "model_name": MODEL,
                "litellm_params": {
                    "model": f"openai/{MODEL}",
                    "api_base": upstream,
                    "api_key": "unused",
                },
            }
        ],
        "general_settings": {"master_key": master_key},
        "litellm_settings": {"telemetry": False},
    }
    path = workdir / "litellm.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = {
        "LITELLM_TELEMETRY": "False",
        "DISABLE_SCHEMA_UPDATE": "True",
        "DATABASE_URL": "",
        "NO_DOCS": "True",
    }
    env_clean = {key: value for key, value in env.items() if value}
    process = processes.start(
        BenchProcess(
            "litellm",
            [
                str(LITELLM_BIN),
                "--config",
                str(path),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--num_workers",
                "1",
            ],
            workdir / "litellm.log",
            cores=cores,
            env=env_clean,
        )
    )
    try:
        wait_http(
            f"http://127.0.0.1:{port}/v1/models",
            process,
            timeout=180,
            headers={"Authorization": f"Bearer {master_key}"},
        )
    except (RuntimeError, TimeoutError) as exc:
        processes.stop(process)
        return f"LiteLLM did not start: {exc}"
    return Target(
        "litellm",
        f"http://127.0.0.1:{port}/v1",
        process,
        token=master_key,
        detail={"version": version, "workers": 1, "database": None},
    )


def run_json(argv: Sequence[str], cores: str | None, timeout: float) -> dict[str, Any]:
    """Run a helper (the load generator) pinned to ``cores``; parse the JSON it prints."""
    import json

    prefix = ["taskset", "-c", cores] if cores is not None else []
    result = subprocess.run(
        [*prefix, *argv],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        cwd=ROOT,
        preexec_fn=_raise_fd_limit,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{argv[1]} failed ({result.returncode}):\n{result.stderr[-2000:]}")
    parsed: dict[str, Any] = json.loads(result.stdout)
    return parsed


def sample_cpu(process: CpuMeasured | None) -> Callable[[], float]:
    """Start measuring the CPU seconds ``process`` uses; call the result to read the delta."""
    if process is None:
        return lambda: 0.0
    before = process.cpu_seconds()
    return lambda: process.cpu_seconds() - before


def run_main(main: Callable[[], int]) -> None:
    """Run a benchmark's ``main`` as its program: SIGTERM unwinds like Ctrl-C (through
    ``ProcessSet``, which stops every process it started), and either exits 130."""

    def _terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted; every process was stopped", file=sys.stderr)
        sys.exit(130)
