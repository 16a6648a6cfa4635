"""Proxy benchmark entry for ``make bench`` (``bench/run_all.py`` runs every ``bench_*.py``).

A thin wrapper over :func:`proxy_bench.main`; see ``bench/proxy_bench.py --help``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from proxy_bench import main

if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        print("interrupted; every process was stopped", file=sys.stderr)
        sys.exit(130)
