"""How soon a slot freed on one edge is reused by a request waiting on another edge.

Two edges' admissions (each with its own ``SharedGate`` and store client) share one provider of
capacity 1 through a real ``redis-server`` on loopback. Edge B holds the slot; a request waits
on edge A; B releases; the figure is the time from B's release to A's request being admitted
(its lease taken in the store). Repeated ``--rounds`` times; p50, p90, p99 and max reported.
No resync runs meanwhile (the gates' clocks stand still): what is measured is the release
published by the store and heard by A.

    .venv/bin/python bench/bench_shared_wake.py [--rounds 500]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from iop_edge.admission import AdmissionScheduler
from iop_edge.pool import PoolPolicy, ProviderPolicy, SharedPolicy
from iop_edge.shared.gate import SharedGate
from iop_edge.shared.store import SharedStore
from iop_edge.testing.clock import FakeClock
from iop_edge.testing.redis_server import RedisServer


def _policy() -> PoolPolicy:
    provider = ProviderPolicy(
        node_id="n", provider_id="p", capacity=1, long_context_capacity=1, priority=0, enabled=True
    )
    return PoolPolicy(
        max_queue=16,
        queue_timeout_ms=0,
        providers=(provider,),
        groups={"m": (provider.key,)},
        shared=SharedPolicy(),
    )


async def _run(rounds: int) -> list[float]:
    with RedisServer() as server:
        policy = _policy()
        assert policy.shared is not None
        edges = []
        for name in ("a", "b"):
            gate = SharedGate(SharedStore(server.url, instance_id=name), policy.shared, FakeClock())
            edges.append((AdmissionScheduler(policy, clock=FakeClock(), gate=gate), gate))
        for _, gate in edges:
            await gate.start()
        (a, _), (b, _) = edges
        waits: list[float] = []
        try:
            for _ in range(rounds):
                held = await b.admit("m")
                waiting = asyncio.ensure_future(a.admit("m"))
                while a.queue_depth == 0 and not waiting.done():
                    await asyncio.sleep(0)
                released_at = time.perf_counter()
                held.release()
                lease = await waiting
                waits.append(time.perf_counter() - released_at)
                lease.release()
                while b.gate is not None and b.gate.statistics().providers[0].held:
                    await asyncio.sleep(0.0005)
        finally:
            for admission, gate in edges:
                await admission.aclose()
                await gate.aclose()
        return waits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=500)
    args = parser.parse_args()
    waits = sorted(asyncio.run(_run(args.rounds)))

    def at(q: float) -> float:
        return waits[min(len(waits) - 1, int(q * len(waits)))] * 1000

    print(
        f"release on one edge -> a waiter on another admitted, {len(waits)} rounds: "
        f"p50 {at(0.5):.3f} ms, p90 {at(0.9):.3f} ms, p99 {at(0.99):.3f} ms, "
        f"max {waits[-1] * 1000:.3f} ms, mean {statistics.fmean(waits) * 1000:.3f} ms"
    )


if __name__ == "__main__":
    main()
