"""Benchmark: push+pop pairs per second of one fair queue (:mod:`iop_edge.pool.fair`).

One :class:`FairQueue` holds N pending requests spread evenly over K principals (weights 1, 2
and 3 in turn, no caps); each measured pair pushes a new request of a random principal and
dispatches the head (``head`` + ``take``, and the book's ``acquire`` and ``release`` of its
lease), so the queue stays at N. The requests are made before the clock starts: the figure is
the queue's own cost, not the allocation of requests. The last column checks the shares: the
mean served count of a weight-3 principal over that of a weight-1 one (3.00 when every
principal stays backlogged; with more principals than pending requests, they do not). Prints a
Markdown table, the median of several runs.

Run: ``.venv/bin/python bench/bench_fair.py [--pairs 200000] [--runs 5]``
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import time
from collections import Counter

from iop_edge.pool import FairQueue, PendingRequest, PrincipalBook


def run_once(principals: int, pending: int, pairs: int, seed: int) -> tuple[float, float]:
    """Time ``pairs`` push+pop pairs; return (pairs/s, weight-3 : weight-1 served ratio)."""
    rng = random.Random(seed)
    names = [f"principal-{i}" for i in range(principals)]
    weights = {name: float(1 + i % 3) for i, name in enumerate(names)}
    book = PrincipalBook(weights=weights)
    queue = FairQueue(book, "group-0")
    # Arrivals in proportion to the weights, so that every principal stays backlogged.
    population = [name for name in names for _ in range(int(weights[name]))]
    requests = [PendingRequest(i, "group-0", False, 0.0) for i in range(pending + pairs)]
    owners = [population[rng.randrange(len(population))] for _ in requests]
    for i in range(pending):
        queue.push(requests[i], owners[i])
    push = queue.push
    head = queue.head
    take = queue.take
    acquire = book.acquire
    release = book.release
    served: Counter[str] = Counter()
    start = time.perf_counter()
    for i in range(pending, pending + pairs):
        push(requests[i], owners[i])
        request = head()
        assert request is not None
        take(request)
        acquire(request.principal)
        release(request.principal)
    elapsed = time.perf_counter() - start
    for request in requests[: pending + pairs]:
        if request.queue is None:
            served[request.principal] += 1
    heavy = [served[p] for p in names if weights[p] == 3.0]
    light = [served[p] for p in names if weights[p] == 1.0]
    if not (heavy and light):
        return pairs / elapsed, float("nan")
    return pairs / elapsed, statistics.mean(heavy) / statistics.mean(light)


def main() -> None:
    """Run every (principals, pending) case ``--runs`` times and print the table of medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=200_000, help="pairs per run")
    parser.add_argument("--runs", type=int, default=5, help="runs per row (median reported)")
    args = parser.parse_args()
    print(
        f"Python {platform.python_version()} on {platform.machine()}, "
        f"{args.pairs:,} pairs per run, median of {args.runs}"
    )
    print()
    print("| principals | pending | push+pop pairs/s | served weight 3 : weight 1 |")
    print("| ---: | ---: | ---: | ---: |")
    for principals in (1, 10, 100, 1_000):
        for pending in (100, 10_000):
            results = [run_once(principals, pending, args.pairs, seed) for seed in range(args.runs)]
            rate = statistics.median(r[0] for r in results)
            ratio = results[-1][1]
            shown = "–" if ratio != ratio else f"{ratio:.2f}"
            print(f"| {principals:,} | {pending:,} | {rate:,.0f} | {shown} |")


if __name__ == "__main__":
    main()
