"""Benchmark: admit+release pairs per second of the pure admission scheduler.

1,000 providers (capacity 4, 1 long-context slot, priorities 0-2) on 100 nodes, 100 model groups
of 20 providers each (every provider shared by two groups). Every slot is taken and the queue
holds N pending requests; each measured pair submits a new request (it queues) and releases the
oldest lease (its slot goes to the oldest pending request the provider can serve), so the queue
stays near N (a freed slot that nobody pending can use waits for the next submit instead, so a
small queue drifts a little: see the last column). 10% of the requests are long-context; the
queue timeout is on (30 s), so the deadline heap is exercised too. The "idle" row has no queue:
the pair is a direct dispatch and its release.

Fair sharing (SPEC §5.2) is on, as by default. The rows with 1,000 principals give them weights
1, 2 and 3 in turn and send each request from a random one, in proportion to its weight, so that
all of them keep requests waiting: a freed slot is then chosen across 1,000 principals. As the
``serve`` command does once started, the scheduler's own structures (the pool) are frozen out of
the garbage collector before the clock starts; the requests are not. Prints a Markdown table,
the median of several runs.

Run: ``.venv/bin/python bench/bench_scheduler.py [--pairs 200000] [--runs 5]``
"""

from __future__ import annotations

import argparse
import gc
import platform
import random
import statistics
import time
from collections import deque

from iop_edge.pool import (
    Decision,
    Dispatch,
    PoolPolicy,
    PoolScheduler,
    ProviderPolicy,
    SlotLease,
)

PROVIDERS = 1000
GROUPS = 100
GROUP_SIZE = 20
CAPACITY = 4
LONG_SHARE = 0.1


def build_policy(max_queue: int, weights: dict[str, float]) -> PoolPolicy:
    """The benchmark pool: 1,000 providers in 100 overlapping groups."""
    providers = tuple(
        ProviderPolicy(
            node_id=f"node-{i // 10}",
            provider_id=f"p{i}",
            capacity=CAPACITY,
            long_context_capacity=1,
            priority=i % 3,
            enabled=True,
        )
        for i in range(PROVIDERS)
    )
    groups = {
        f"group-{g}": tuple(providers[(g * 10 + j) % PROVIDERS].key for j in range(GROUP_SIZE))
        for g in range(GROUPS)
    }
    return PoolPolicy(
        max_queue=max_queue,
        queue_timeout_ms=30_000,
        providers=providers,
        groups=groups,
        weights=weights,
    )


def run_once(principals: int, pending: int, pairs: int, seed: int) -> tuple[float, int]:
    """Time ``pairs`` admit+release pairs at queue depth ``pending`` with requests from
    ``principals`` principals; return (pairs/s, depth)."""
    rng = random.Random(seed)
    names = [f"app-{i}" for i in range(principals)]
    weights = {name: float(1 + i % 3) for i, name in enumerate(names)} if principals > 1 else {}
    population = [name for name in names for _ in range(int(weights.get(name, 1)))]
    scheduler = PoolScheduler(build_policy(pending + 1000, weights))
    gc.collect()
    gc.freeze()
    leases: deque[SlotLease] = deque()
    group_ids = [f"group-{g}" for g in range(GROUPS)]
    now = 0.0

    def collect(decisions: list[Decision]) -> None:
        for decision in decisions:
            if isinstance(decision, Dispatch):
                leases.append(decision.lease)

    if pending:
        # Saturate every slot, then queue ``pending`` requests spread over the groups.
        i = 0
        while scheduler.queue_depth < pending:
            who = population[i % len(population)]
            collect(scheduler.submit(group_ids[i % GROUPS], now=now, principal=who).decisions)
            i += 1
    workload = [
        (
            group_ids[rng.randrange(GROUPS)],
            rng.random() < LONG_SHARE,
            population[rng.randrange(len(population))],
        )
        for _ in range(pairs)
    ]
    submit = scheduler.submit
    release = scheduler.release
    start = time.perf_counter()
    if pending:
        for group_id, long_context, who in workload:
            now += 1e-6
            collect(submit(group_id, long_context=long_context, now=now, principal=who).decisions)
            collect(release(leases.popleft(), now))
    else:
        for group_id, long_context, who in workload:
            now += 1e-6
            decisions = submit(
                group_id, long_context=long_context, now=now, principal=who
            ).decisions
            decision = decisions[-1]
            assert isinstance(decision, Dispatch)
            release(decision.lease, now)
    elapsed = time.perf_counter() - start
    gc.unfreeze()
    return pairs / elapsed, scheduler.queue_depth


def main() -> None:
    """Run every queue depth ``--runs`` times and print the Markdown table of medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=200_000, help="pairs per run")
    parser.add_argument("--runs", type=int, default=5, help="runs per row (median reported)")
    args = parser.parse_args()
    print(
        f"Python {platform.python_version()} on {platform.machine()}, {PROVIDERS} providers, "
        f"{GROUPS} groups of {GROUP_SIZE}, {args.pairs:,} pairs per run, median of {args.runs}"
    )
    print()
    print("| principals | pending requests at start | admit+release pairs/s | pending at end |")
    print("| ---: | ---: | ---: | ---: |")
    cases = [(1, pending) for pending in (0, 100, 1_000, 10_000)]
    cases += [(principals, pending) for principals in (100, 1_000) for pending in (1_000, 10_000)]
    for principals, pending in cases:
        results = [run_once(principals, pending, args.pairs, seed) for seed in range(args.runs)]
        rate = statistics.median(r[0] for r in results)
        depth = results[-1][1]
        label = "0 (idle)" if pending == 0 else f"{pending:,}"
        print(f"| {principals:,} | {label} | {rate:,.0f} | {depth:,} |")


if __name__ == "__main__":
    main()
