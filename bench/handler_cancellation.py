"""What aiohttp's handler cancellation costs per request (issue 16).

iop-edge's server runs with ``handler_cancellation=True``: a client that disconnects cancels
its handler, which aborts the upstream call and frees the slot. The alternative is to leave it
off and watch the connection ourselves. This measures the first option's price: two
``bench/passthrough.py`` processes on the same fake upstream, one with
``--handler-cancellation``, each pinned to core 1, loaded in turn (alternating order per round)
by ``bench/loadgen.py`` on core 0 at ``-c`` concurrency; CPU per request is read from
``/proc/PID/stat`` around each load. Prints every round and the median ratio on / off.

    .venv/bin/python bench/handler_cancellation.py --rounds 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers import BENCH, MODEL, BenchProcess, ProcessSet, free_port, start_fake, wait_http


def cpu_seconds(pid: int) -> float:
    """User + system CPU of process ``pid`` so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("-c", "--concurrency", type=int, default=16)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per load")
    options = parser.parse_args(argv)
    per_request: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory(prefix="iop-cancel-") as tmp, ProcessSet() as processes:
        workdir = Path(tmp)
        fake = start_fake(processes, workdir, "0")
        targets: dict[str, tuple[int, str]] = {}
        for label in per_request:
            port = free_port()
            command = [sys.executable, str(BENCH / "passthrough.py"), "--port", str(port)]
            command += ["--upstream", fake.base_url.removesuffix("/v1")]
            if label == "on":
                command.append("--handler-cancellation")
            process = processes.start(
                BenchProcess(f"pass-{label}", command, workdir / f"{label}.log", cores="1")
            )
            wait_http(f"http://127.0.0.1:{port}/v1/models", process, timeout=30)
            assert process.popen is not None
            targets[label] = (process.popen.pid, f"http://127.0.0.1:{port}/v1")
        for index in range(options.rounds):
            order = ("off", "on") if index % 2 == 0 else ("on", "off")
            for label in order:
                pid, base_url = targets[label]
                before = cpu_seconds(pid)
                load = ["taskset", "-c", "0", sys.executable, str(BENCH / "loadgen.py")]
                load += ["--base-url", base_url, "--model", MODEL, "--warmup", "0.5"]
                load += ["-c", str(options.concurrency), "--duration", str(options.duration)]
                out = subprocess.run(load, capture_output=True, text=True, check=True).stdout
                completed = json.loads(out)["total_completed"]
                per_request[label].append((cpu_seconds(pid) - before) / completed * 1e6)
    for label, values in per_request.items():
        rounds = ", ".join(f"{value:.1f}" for value in values)
        print(
            f"handler_cancellation {label}: {rounds} µs/req; median {statistics.median(values):.1f}"
        )
    ratio = statistics.median(per_request["on"]) / statistics.median(per_request["off"])
    print(f"on / off: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
