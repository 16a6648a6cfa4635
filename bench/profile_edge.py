"""Profile ``iop-edge serve`` under the proxy benchmark's load with py-spy (issue 16).

Starts the fake upstream and iop-edge as ``bench/proxy_bench.py`` does (its config: auth on,
metrics on, JSON request log at info, one provider), runs ``bench/loadgen.py`` against it in
``--mode plain|stream`` at ``-c`` concurrency, and samples the edge with ``py-spy record`` for
``--duration`` seconds, twice in a row under the same load: once for the collapsed stacks
(``profile-<mode>-c<N>.txt``, what ``flamegraph.pl`` and speedscope.app read), once for py-spy's
flame graph (``.svg``), both in ``bench/results/``. Prints the functions with the largest share of
the samples — inclusive (anything under them) and self (in them) — so a profile can be read
without a browser.

py-spy is not a project dependency: ``.venv/bin/pip install py-spy`` first. It needs ptrace
(root, or ``kernel.yama.ptrace_scope`` 0).

Usage::

    .venv/bin/python bench/profile_edge.py --mode stream -c 16 --duration 15
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers import (
    BENCH,
    MODEL,
    ProcessSet,
    edge_config,
    free_port,
    new_principal_token,
    start_edge,
    start_fake,
)

RESULTS = BENCH / "results"


def shares(collapsed: Path, top: int) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """The ``top`` functions by inclusive and by self share of the samples."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        total += count
        frames = [_short(frame) for frame in stack.split(";")]
        for frame in set(frames):
            inclusive[frame] += count
        own[frames[-1]] += count
    total = max(total, 1)
    return (
        [(name, 100 * n / total) for name, n in inclusive.most_common(top)],
        [(name, 100 * n / total) for name, n in own.most_common(top)],
    )


def _short(frame: str) -> str:
    """``func (path/to/module.py:123)`` → ``func (module.py)``; line numbers merged."""
    name, _, where = frame.partition(" (")
    module = where.rsplit("/", 1)[-1].split(":", 1)[0]
    return f"{name} ({module})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("plain", "stream"), default="plain")
    parser.add_argument("-c", "--concurrency", type=int, default=16)
    parser.add_argument("--duration", type=float, default=15.0, help="seconds sampled")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=40, help="functions listed")
    parser.add_argument("--output", type=Path, default=RESULTS)
    options = parser.parse_args(argv)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        print("py-spy is not installed: .venv/bin/pip install py-spy", file=sys.stderr)
        return 2
    options.output.mkdir(parents=True, exist_ok=True)
    stem = options.output / f"profile-{options.mode}-c{options.concurrency}"
    with tempfile.TemporaryDirectory(prefix="iop-profile-") as tmp, ProcessSet() as processes:
        workdir = Path(tmp)
        fake = start_fake(processes, workdir, None)
        token, digest = new_principal_token()
        config = edge_config(fake.base_url, port=free_port(), token_hash=digest)
        edge = start_edge(processes, workdir, None, config, token)
        assert edge.process is not None
        assert edge.process.popen is not None
        load = [
            sys.executable,
            str(BENCH / "loadgen.py"),
            "--base-url",
            edge.base_url,
            "--model",
            MODEL,
            "--token",
            token,
            "-c",
            str(options.concurrency),
            "--duration",
            str(2 * options.duration + 5),
            "--warmup",
            "1",
        ]
        if options.mode == "stream":
            load.append("--stream")
        loadgen = subprocess.Popen(load, stdout=subprocess.DEVNULL)
        try:
            pid = str(edge.process.popen.pid)
            common = ["--pid", pid, "--rate", str(options.rate), "--nonblocking"]
            common += ["--duration", str(int(options.duration))]
            for form, suffix in (("raw", "txt"), ("flamegraph", "svg")):
                subprocess.run(
                    [py_spy, "record", *common, "--format", form, "-o", f"{stem}.{suffix}"],
                    check=True,
                    capture_output=True,
                )
        finally:
            loadgen.wait(timeout=2 * options.duration + 60)
    inclusive, own = shares(Path(f"{stem}.txt"), options.top)
    print(f"# {options.mode}, c={options.concurrency}: {stem}.svg\n")
    print("| inclusive % | function |\n| ---: | --- |")
    for name, pct in inclusive:
        print(f"| {pct:.1f} | {name} |")
    print("\n| self % | function |\n| ---: | --- |")
    for name, pct in own:
        print(f"| {pct:.1f} | {name} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
