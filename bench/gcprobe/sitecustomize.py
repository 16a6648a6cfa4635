"""A measurement probe, not part of iop-edge: times every garbage collection of a process.

Put this directory first on ``PYTHONPATH`` and set ``GCPROBE_OUT=PREFIX``: each Python process
started with that environment (the daemon, the fake upstream, the load generator) writes
``PREFIX.<program>.<pid>.json`` at exit — per generation: collections, total and longest
seconds, and how many took over 50 ms. How issue 16 found the deep-queue tail::

    PYTHONPATH=bench/gcprobe GCPROBE_OUT=/tmp/gc .venv/bin/python bench/proxy_bench.py \\
        --scaling-only --providers 1 --no-litellm
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import sys
import time
from typing import Any

if os.environ.get("GCPROBE_OUT"):
    _started = [0.0]
    _stats: dict[int, dict[str, Any]] = {
        generation: {"count": 0, "total_s": 0.0, "max_s": 0.0, "over_50ms": 0}
        for generation in (0, 1, 2)
    }

    def _timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            _started[0] = time.perf_counter()
            return
        took = time.perf_counter() - _started[0]
        stats = _stats[info["generation"]]
        stats["count"] += 1
        stats["total_s"] += took
        stats["max_s"] = max(stats["max_s"], took)
        stats["over_50ms"] += took > 0.05

    def _write() -> None:
        program = os.path.basename(sys.argv[0]) or "python"
        path = f"{os.environ['GCPROBE_OUT']}.{program}.{os.getpid()}.json"
        with open(path, "w", encoding="utf-8") as handle:
            json.dump({"argv": sys.argv[:3], "threshold": gc.get_threshold(), "gc": _stats}, handle)

    gc.callbacks.append(_timed)
    atexit.register(_write)
