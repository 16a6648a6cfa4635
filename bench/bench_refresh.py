"""Benchmark: classify two generated configs of 2,000 providers that differ in 100 places.

Run: ``.venv/bin/python bench/bench_refresh.py [--runs N]``. The candidate changes 60 live
values (capacity, priority, enabled), 20 model display names and 20 restart values (adapter
URLs and provider labels); the figure is the median time of ``refresh(running, candidate)``
on already-loaded configs (load time is measured by bench_config.py).
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import time
from typing import Any

from iop_edge.config import parse_config
from iop_edge.config.refresh import refresh
from iop_edge.testing.configs import generate_config


def candidate_doc(doc: dict[str, Any], changes: int = 100, seed: int = 1) -> dict[str, Any]:
    """A copy of ``doc`` with ``changes`` distinct values changed."""
    rng = random.Random(seed)
    doc = copy.deepcopy(doc)
    providers = [p for n in doc["nodes"] for p in n["providers"]]
    picked = rng.sample(providers, changes)
    for i, provider in enumerate(picked[:60]):
        field = ("capacity", "priority", "enabled")[i % 3]
        if field == "capacity":
            provider["capacity"] += 1
        elif field == "priority":
            provider["priority"] += 1
        else:
            provider["enabled"] = False
    for model in rng.sample(doc["models"], 20):
        model["display_name"] += " (new)"
    for i, provider in enumerate(picked[80:]):
        provider["provider"] = f"label-{i}"
    return doc


def main() -> None:
    """Print the median."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    doc = generate_config(200, 10, 500)
    running = parse_config(copy.deepcopy(doc))
    candidate = parse_config(candidate_doc(doc))
    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        result = refresh(running, candidate, mode="apply").result
        times.append((time.perf_counter() - t0) * 1000)
    print("2,000 providers (200 nodes × 10), 500 models; candidate differs in 100 places")
    print(f"report entries: {len(result.report)}, result: {result.result}")
    print(f"\n| operation | median ms ({args.runs} runs) |\n| --- | ---: |")
    print(f"| refresh (classify + apply live + validate) | {statistics.median(times):.1f} |")


if __name__ == "__main__":
    main()
