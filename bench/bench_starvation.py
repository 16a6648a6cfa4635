"""Benchmark: the starvation scenario of fair sharing among principals (SPEC §5.2).

What it measures: how much a light principal's latency grows while a heavy one floods the pool,
with ``provider_pool.fair_share: principal`` (the default) and with ``fair_share: none`` (one
arrival-order queue, the behaviour before §5.2).

The scenario, once per mode: ``iop-edge serve`` as a subprocess on a generated config, model
``chat`` on one fake OpenAI-compatible upstream (:class:`~iop_edge.testing.fake_openai.FakeOpenAI`,
in process) of ``--capacity`` slots (2), each request answered after ``--latency`` s (0.1). Two
principals, apps A and B, each with its own bearer token; ``max_queue`` 64 and
``queue_timeout_ms`` 60000, so nothing is refused. Clients are the ``openai`` SDK
(``max_retries=0``).

1. B alone sends ``--b-requests`` (20) sequential chat requests: B's unloaded p50.
2. A keeps ``--flood`` (30) requests in flight (as many client loops, each sending its next
   request as soon as the previous one returns); after a short warm-up B again sends
   ``--b-requests`` sequential requests: B's p50 under A's flood. Throughputs are counted over
   B's measurement window: A's (its answers seen by its clients) and the upstream's (A's and
   B's requests it answered; work conservation: near ``capacity / latency``, 20 req/s by
   default, in both modes, since a freed slot never idles while anyone waits).

Prints a Markdown table (ratio = B's p50 under flood / B's p50 alone), then one JSON line.
Expected: 1.5–2× with ``principal`` (B waits for the next freed slot but one: how long depends
on how the slots' phases line up, so it differs from run to run), about ``flood / capacity``
(~16×) with ``none`` (B waits behind A's whole backlog). The upstream's rate falls short of
``capacity / latency`` by the per-request overhead (B's unloaded p50 over ``latency``).

Usage::

    .venv/bin/python bench/bench_starvation.py
    .venv/bin/python bench/bench_starvation.py --b-requests 40 --json bench/results/starvation.json

Exit status 0 when ``fair_share: principal`` keeps B's ratio at most 3 and no request failed (in
either mode), else 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import openai
import yaml

from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from iop_edge.tokens import token_hash

IOP_EDGE = str(Path(sys.executable).with_name("iop-edge"))
TOKENS = {"app-a": "iop_bench-token-of-app-a", "app-b": "iop_bench-token-of-app-b"}
MODES = ("principal", "none")
MAX_RATIO = 3.0


def config(upstream: str, capacity: int, mode: str) -> dict[str, Any]:
    """Model ``chat`` on one provider of ``capacity`` slots; one token and principal per app."""
    return {
        "openai": {
            "listen": "127.0.0.1:0",
            "principal_tokens": [
                {"token_ref": ref, "token_hash_sha256": token_hash(raw), "principal_ref": ref}
                for ref, raw in TOKENS.items()
            ],
        },
        "metrics": {"listen": "127.0.0.1:0"},
        "console": {"listen": "127.0.0.1:0"},
        "logging": {"level": "info", "format": "json"},
        "provider_pool": {"max_queue": 64, "queue_timeout_ms": 60000, "fair_share": mode},
        "models": [{"id": "chat", "context_window_tokens": 8192, "providers": ["up"]}],
        "nodes": [
            {
                "id": "local",
                "adapters": [{"name": "oa", "type": "openai_compat", "base_url": upstream}],
                "providers": [
                    {
                        "id": "up",
                        "type": "openai_compat",
                        "category": "api",
                        "adapter": "oa",
                        "models": ["fake-model"],
                        "capacity": capacity,
                    }
                ],
            }
        ],
    }


async def listening(log_path: Path, daemon: subprocess.Popen[bytes]) -> str:
    """The OpenAI listener's URL, from the daemon's ``listening`` log line."""
    async with asyncio.timeout(30):
        while True:
            if daemon.poll() is not None:
                raise RuntimeError(f"iop-edge exited: {log_path.read_text()[-2000:]}")
            for line in log_path.read_text().splitlines():
                event = json.loads(line)
                if event.get("event") == "listening":
                    return str(event["openai"])
            await asyncio.sleep(0.05)


class Clients:
    """One SDK client per app, the failures seen and A's completion times."""

    def __init__(self, url: str) -> None:
        self.sdk = {
            ref: openai.AsyncOpenAI(base_url=url + "/v1", api_key=raw, max_retries=0, timeout=90)
            for ref, raw in TOKENS.items()
        }
        self.failures: list[str] = []
        self.a_done: list[float] = []

    async def ask(self, ref: str, text: str) -> float | None:
        """One chat request of ``ref``; its latency in seconds, ``None`` when it failed."""
        started = time.perf_counter()
        try:
            reply = await self.sdk[ref].chat.completions.create(
                model="chat", messages=[{"role": "user", "content": text}]
            )
        except openai.OpenAIError as exc:
            self.failures.append(f"{ref} {text}: {type(exc).__name__}: {exc}")
            return None
        if reply.choices[0].message.content != text:
            self.failures.append(f"{ref} {text}: answered {reply.choices[0].message.content!r}")
            return None
        return time.perf_counter() - started

    async def sequential(self, count: int, label: str) -> tuple[list[float], float, float]:
        """B's ``count`` requests one after the other: latencies, start and end times."""
        started = time.perf_counter()
        latencies = [await self.ask("app-b", f"{label} {n}") for n in range(count)]
        return [t for t in latencies if t is not None], started, time.perf_counter()

    async def flood(self, loop: int, stop: asyncio.Event) -> None:
        """One of A's client loops: ask again as soon as answered, until ``stop``."""
        n = 0
        while not stop.is_set():
            if await self.ask("app-a", f"flood {loop}.{n}") is not None:
                self.a_done.append(time.perf_counter())
            n += 1

    async def close(self) -> None:
        for client in self.sdk.values():
            await client.close()


async def run_mode(args: argparse.Namespace, fake: FakeOpenAI, mode: str) -> dict[str, Any]:
    """The scenario against a fresh daemon with ``fair_share: mode``."""
    work = Path(tempfile.mkdtemp(prefix="iop-edge-starvation-"))
    path = work / "edge.yaml"
    path.write_text(yaml.safe_dump(config(fake.base_url, args.capacity, mode), sort_keys=False))
    log_path = work / "edge.log"
    with open(log_path, "w") as log:
        daemon = subprocess.Popen(
            [IOP_EDGE, "serve", "--config", str(path), "--drain-timeout", "10", "--no-parent"],
            stderr=log,
        )
    try:
        clients = Clients(await listening(log_path, daemon))
        for ref in TOKENS:  # warm-up: connections opened, first-request costs paid
            await clients.ask(ref, "warm-up")
        alone, _, _ = await clients.sequential(args.b_requests, "alone")
        stop = asyncio.Event()
        loops = [asyncio.create_task(clients.flood(i, stop)) for i in range(args.flood)]
        await asyncio.sleep(5 * args.latency)  # A's backlog builds up
        served = fake.completed
        flooded, b_start, b_end = await clients.sequential(args.b_requests, "flooded")
        served = fake.completed - served
        stop.set()
        await asyncio.gather(*loops)
        await clients.close()
    finally:
        daemon.terminate()
        exit_code = daemon.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    a_count = sum(1 for t in clients.a_done if b_start <= t <= b_end)
    p50_alone = statistics.median(alone) if alone else float("nan")
    p50_flood = statistics.median(flooded) if flooded else float("nan")
    return {
        "mode": mode,
        "b_p50_alone_ms": round(p50_alone * 1000, 1),
        "b_p50_flood_ms": round(p50_flood * 1000, 1),
        "b_max_flood_ms": round(max(flooded, default=float("nan")) * 1000, 1),
        "ratio": round(p50_flood / p50_alone, 2),
        "a_requests_per_s": round(a_count / (b_end - b_start), 1),
        "upstream_requests_per_s": round(served / (b_end - b_start), 1),
        "a_requests_ok": len(clients.a_done),
        "failures": len(clients.failures),
        "failure_examples": clients.failures[:5],
        "daemon_exit_code": exit_code,
    }


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Both modes against one fake upstream."""
    async with FakeOpenAI(behavior=FakeBehavior(latency=args.latency)) as fake:
        return [await run_mode(args, fake, mode) for mode in MODES]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--b-requests", type=int, default=20, help="B's sequential requests")
    parser.add_argument("--flood", type=int, default=30, help="A's requests kept in flight")
    parser.add_argument("--latency", type=float, default=0.1, help="upstream latency, s")
    parser.add_argument("--capacity", type=int, default=2, help="upstream slots")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args()
    started = time.perf_counter()
    results = asyncio.run(run(args))
    elapsed = time.perf_counter() - started
    print(
        f"capacity {args.capacity}, latency {args.latency * 1000:.0f} ms, A's flood "
        f"{args.flood} in flight, B {args.b_requests} sequential requests per phase"
    )
    print()
    print(
        "| fair_share | B p50 alone ms | B p50 under A's flood ms | ratio | A req/s "
        "| upstream req/s | failures |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        print(
            f"| {r['mode']} | {r['b_p50_alone_ms']:.1f} | {r['b_p50_flood_ms']:.1f} "
            f"| {r['ratio']:.2f}× | {r['a_requests_per_s']:.1f} "
            f"| {r['upstream_requests_per_s']:.1f} | {r['failures']} |"
        )
    principal = results[0]
    passed = principal["ratio"] <= MAX_RATIO and not any(r["failures"] for r in results)
    report = {
        "benchmark": "starvation",
        "capacity": args.capacity,
        "latency_s": args.latency,
        "flood": args.flood,
        "b_requests": args.b_requests,
        "results": results,
        "elapsed_s": round(elapsed, 1),
        "passed": passed,
    }
    print()
    print(json.dumps(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
