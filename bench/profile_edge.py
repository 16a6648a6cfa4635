"""Profile ``iop-edge serve`` under the proxy benchmark's load with py-spy (issue 16).

Starts the fake upstream and iop-edge as ``bench/proxy_bench.py`` does (its config: auth on,
metrics on, JSON request log at info, one provider), runs ``bench/loadgen.py`` against it in
``--mode plain|stream`` at ``-c`` concurrency, and samples the edge with ``py-spy record`` for
``--duration`` seconds, twice in a row under the same load: once for the collapsed stacks
(``profile-<mode>-c<N>.txt``, what ``flamegraph.pl`` and speedscope.app read), once for py-spy's
flame graph (``.svg``), both in ``bench/results/``. Prints the functions with the largest share of
the samples — inclusive (anything under them) and self (in them) — so a profile can be read
without a browser.

``--compare`` then profiles ``bench/passthrough.py`` the same way
(``profile-<mode>-c<N>-passthrough.*``) and prints, per function, the sampled µs per request in
each (a sample is 1/rate s of a running thread), and iop-edge's µs per request under its own
functions, by the innermost one: where its extra CPU goes.

``--api messages`` sends Anthropic Messages instead (issue 27), ``--api responses`` OpenAI
Responses (issue 28, ``store: false``, or ``store: true`` with ``--store``), translated to chat
by the edge, or with ``--native`` passed through (the config's provider then has ``native_apis:
[messages, responses]``); files ``profile-<mode>-c<N>-<api>[-stored][-native].*``.
``--compare-chat`` compares with iop-edge under chat load (``profile-<mode>-c<N>-chat.*``)
instead of the pass-through: where the surface's extra CPU goes.

``--shared`` profiles an edge whose config has ``provider_pool.shared`` on a ``redis-server``
started for the run (``iop_edge.testing.redis_server``; files ``profile-<mode>-c<N>-shared.*``);
with ``--compare``, the comparison is the same edge without ``shared``
(``profile-<mode>-c<N>-unshared.*``) instead of the pass-through: where a lease's CPU goes.

py-spy is not a project dependency: ``.venv/bin/pip install py-spy`` first. It needs ptrace
(root, or ``kernel.yama.ptrace_scope`` 0).

Usage::

    .venv/bin/python bench/profile_edge.py --mode stream -c 16 --duration 15
    .venv/bin/python bench/profile_edge.py --mode plain -c 16 --duration 10 --compare
    .venv/bin/python bench/profile_edge.py --mode stream --api messages --duration 10 --compare-chat
    .venv/bin/python bench/profile_edge.py --mode stream --api responses --store --compare-chat
    .venv/bin/python bench/profile_edge.py --mode plain -c 1 --duration 10 --shared --compare
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers import (
    BENCH,
    MODEL,
    NATIVE_MODEL,
    ProcessSet,
    edge_config,
    free_port,
    new_principal_token,
    start_edge,
    start_fake,
    start_passthrough,
)

from iop_edge.testing.redis_server import RedisServer

RESULTS = BENCH / "results"


def samples(collapsed: Path) -> Iterator[tuple[list[str], int]]:
    """Each stack of a collapsed (``raw``) py-spy file, outermost frame first, and its count."""
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if stack:
            yield stack.split(";"), int(count_text)


def shares(collapsed: Path, top: int) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """The ``top`` functions by inclusive and by self share of the samples."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for stack, count in samples(collapsed):
        total += count
        frames = [_short(frame) for frame in stack]
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


def profile(
    target_name: str,
    options: argparse.Namespace,
    py_spy: str,
    workdir: Path,
    api: str = "chat",
    *,
    shared: bool = False,
) -> tuple[Path, float]:
    """Sample one target under load (``api``: what the load sends, chat, Anthropic Messages or
    OpenAI Responses; ``shared``: the edge with ``provider_pool.shared`` on a redis-server
    started for it); its collapsed stacks and the requests per sampled second."""
    stem = options.output / f"profile-{options.mode}-c{options.concurrency}"
    if target_name == "passthrough":
        stem = stem.with_name(stem.name + "-passthrough")
    elif options.shared:
        stem = stem.with_name(stem.name + ("-shared" if shared else "-unshared"))
    store = api == "responses" and options.store
    if api != "chat":
        suffix = f"-{api}" + ("-stored" if store else "") + ("-native" if options.native else "")
        stem = stem.with_name(stem.name + suffix)
    elif options.compare_chat:
        stem = stem.with_name(stem.name + "-chat")  # the reference of a surface's profile
    model = NATIVE_MODEL if api != "chat" and options.native else MODEL
    with ProcessSet() as processes, contextlib.ExitStack() as stack:
        fake = start_fake(processes, workdir, None)
        token, digest = new_principal_token()
        if target_name == "passthrough":
            target = start_passthrough(processes, workdir, None, fake.base_url)
        else:
            config = edge_config(
                fake.base_url, port=free_port(), token_hash=digest, native_group=options.native
            )
            if shared:
                server = stack.enter_context(RedisServer(password=secrets.token_hex(16)))
                config["provider_pool"]["shared"] = {"store": server.url}
            target = start_edge(processes, workdir, None, config, token)
        assert target.process is not None
        assert target.process.popen is not None
        load = [
            sys.executable,
            str(BENCH / "loadgen.py"),
            "--base-url",
            target.base_url,
            "--model",
            model,
            "--api",
            api,
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
        if store:
            load.append("--store")
        loadgen = subprocess.Popen(load, stdout=subprocess.PIPE)
        try:
            pid = str(target.process.popen.pid)
            common = ["--pid", pid, "--rate", str(options.rate), "--nonblocking"]
            common += ["--duration", str(int(options.duration))]
            for form, suffix in (("raw", "txt"), ("flamegraph", "svg")):
                subprocess.run(
                    [py_spy, "record", *common, "--format", form, "-o", f"{stem}.{suffix}"],
                    check=True,
                    capture_output=True,
                )
        finally:
            out, _ = loadgen.communicate(timeout=2 * options.duration + 60)
    return Path(f"{stem}.txt"), float(json.loads(out)["rps"])


def micros_per_sample(options: argparse.Namespace, rps: float) -> float:
    """µs per request that one sample stands for: 1/rate s over ``rps × duration`` requests."""
    rate, duration = float(options.rate), float(options.duration)
    return 1e6 / rate / max(rps * duration, 1e-9)


def per_request(
    collapsed: Path, options: argparse.Namespace, rps: float
) -> tuple[float, collections.Counter[str]]:
    """Sampled µs per request in all, and inclusive µs per request by function: a sample is
    1/rate s of a thread running, over ``rps × duration`` requests."""
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for stack, count in samples(collapsed):
        total += count
        for frame in {_short(frame) for frame in stack}:
            inclusive[frame] += count
    scale = micros_per_sample(options, rps)
    return total * scale, collections.Counter({k: v * scale for k, v in inclusive.items()})


def own_work(
    collapsed: Path, options: argparse.Namespace, rps: float
) -> tuple[float, collections.Counter[str]]:
    """Sampled µs per request under iop-edge's own functions, by the innermost one of each
    sample (and the library function it was in, if any): where the CPU that the pass-through
    does not spend goes, together with the aiohttp client and server work both do."""
    by_caller: collections.Counter[str] = collections.Counter()
    for frames, count in samples(collapsed):
        ours = [
            i
            for i, frame in enumerate(frames)
            if "iop_edge/" in frame and "iop_edge/cli/" not in frame
        ]
        if not ours:
            continue
        inner = ours[-1]
        key = _short(frames[inner]).split(" (")[0]
        if inner + 1 < len(frames):
            key += " → " + _short(frames[inner + 1])
        by_caller[key] += count
    scale = micros_per_sample(options, rps)
    counted = collections.Counter({k: v * scale for k, v in by_caller.items()})
    return sum(counted.values()), counted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("plain", "stream"), default="plain")
    parser.add_argument("-c", "--concurrency", type=int, default=16)
    parser.add_argument("--duration", type=float, default=15.0, help="seconds sampled")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=40, help="functions listed")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--compare",
        action="store_true",
        help="also profile bench/passthrough.py under the same load and list, per function, "
        "the sampled µs per request in each",
    )
    parser.add_argument(
        "--api",
        choices=("chat", "messages", "responses"),
        default="chat",
        help="the load: chat completions, Anthropic Messages or OpenAI Responses (translated "
        "unless --native)",
    )
    parser.add_argument(
        "--native",
        action="store_true",
        help="with --api messages or responses: a provider with native_apis: [messages, "
        "responses] (passthrough)",
    )
    parser.add_argument(
        "--store",
        action="store_true",
        help="with --api responses: store: true (the edge keeps each response)",
    )
    parser.add_argument(
        "--shared",
        action="store_true",
        help="the edge with provider_pool.shared on a redis-server started for the run; with "
        "--compare, compared with the same edge without it",
    )
    parser.add_argument(
        "--compare-chat",
        action="store_true",
        help="with --api messages or responses: compare with iop-edge under chat load (not the "
        "pass-through)",
    )
    options = parser.parse_args(argv)
    if options.compare_chat and options.api == "chat":
        parser.error(
            "--compare-chat compares a surface with chat: it needs --api messages|responses"
        )
    if options.store and options.api != "responses":
        parser.error("--store is a field of --api responses")
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        print("py-spy is not installed: .venv/bin/pip install py-spy", file=sys.stderr)
        return 2
    options.output.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="iop-profile-") as tmp:
        collapsed, rps = profile(
            "iop-edge", options, py_spy, Path(tmp), options.api, shared=options.shared
        )
        inclusive, own = shares(collapsed, options.top)
        print(f"# {options.mode}, c={options.concurrency}: {collapsed.with_suffix('.svg')}\n")
        print("| inclusive % | function |\n| ---: | --- |")
        for name, pct in inclusive:
            print(f"| {pct:.1f} | {name} |")
        print("\n| self % | function |\n| ---: | --- |")
        for name, pct in own:
            print(f"| {pct:.1f} | {name} |")
        if not (options.compare or options.compare_chat):
            return 0
        if options.compare_chat:
            other, other_rps = profile("iop-edge", options, py_spy, Path(tmp), "chat")
        elif options.shared:
            other, other_rps = profile("iop-edge", options, py_spy, Path(tmp), options.api)
        else:
            other, other_rps = profile("passthrough", options, py_spy, Path(tmp), options.api)
    this = {"chat": "iop-edge", "messages": "Messages", "responses": "Responses"}[options.api]
    that = "chat" if options.compare_chat else "pass-through"
    if options.shared:
        this, that = "shared", "unshared"
    edge_total, edge_by = per_request(collapsed, options, rps)
    pass_total, pass_by = per_request(other, options, other_rps)
    print(
        f"\n# sampled µs per request: {this} {edge_total:.0f} ({rps:.0f} req/s), "
        f"{that} {pass_total:.0f} ({other_rps:.0f} req/s)\n"
    )
    print(f"| {this} µs | {that} µs | difference | function (inclusive) |")
    print("| ---: | ---: | ---: | --- |")
    names = set(edge_by) | set(pass_by)
    ranked = sorted(names, key=lambda n: -abs(edge_by[n] - pass_by[n]))[: options.top]
    for name in ranked:
        print(
            f"| {edge_by[name]:.1f} | {pass_by[name]:.1f} | "
            f"{edge_by[name] - pass_by[name]:+.1f} | {name} |"
        )
    total, by_caller = own_work(collapsed, options, rps)
    print(f"\n# iop-edge: {total:.0f} µs per request under its own functions, by innermost\n")
    print("| µs/req | function (→ the library function it was in) |\n| ---: | --- |")
    for name, micros in by_caller.most_common(options.top):
        print(f"| {micros:.1f} | {name} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
