"""Benchmark: load + validate a generated config of 200 nodes × 10 providers and 500 models.

Run: ``.venv/bin/python bench/bench_config.py [--runs N]``. Prints the median of N runs of the
whole load (YAML text → effective config) and of its two phases, as a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time

import yaml

from iop_edge.config.load import parse_config, parse_yaml
from iop_edge.testing.configs import generate_config


def measure(runs: int, nodes: int, providers: int, models: int) -> dict[str, float]:
    """Median milliseconds of the YAML phase, the validation phase, and both together."""
    text = yaml.safe_dump(generate_config(nodes, providers, models), sort_keys=False)
    phases: dict[str, list[float]] = {"parse YAML": [], "validate + normalize": [], "total": []}
    for _ in range(runs):
        t0 = time.perf_counter()
        data = parse_yaml(text)
        t1 = time.perf_counter()
        parse_config(data)
        t2 = time.perf_counter()
        phases["parse YAML"].append((t1 - t0) * 1000)
        phases["validate + normalize"].append((t2 - t1) * 1000)
        phases["total"].append((t2 - t0) * 1000)
    return {name: statistics.median(values) for name, values in phases.items()} | {
        "size_kb": len(text) / 1024
    }


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    result = measure(args.runs, 200, 10, 500)
    print(f"config: 200 nodes × 10 providers, 500 models ({result['size_kb']:.0f} KiB of YAML)")
    print(f"median of {args.runs} runs\n")
    print("| phase | ms |\n| --- | ---: |")
    for name in ("parse YAML", "validate + normalize", "total"):
        print(f"| {name} | {result[name]:.1f} |")


if __name__ == "__main__":
    main()
