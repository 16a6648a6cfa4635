"""Run every benchmark in bench/ in turn (``make bench``).

The proxy benchmark runs first, and its headline table (iop-edge's CPU per request against the
bare pass-through's, and the added p50) is printed again at the end, so it is what the run
leaves on the screen; so is that of the surfaces benchmark (``bench_surfaces.py``: Anthropic
Messages and OpenAI Responses, translated and passed through, against chat on the same
provider), the memory of the stored responses of ``/v1/responses`` under a soak
(``bench_responses_store.py``), and a remote node against the same provider local
(``bench_nodes.py``: added p50, events per second through one link, the edge's and the node's
CPU per request), and several edges sharing one pool through a store (``bench_shared.py``:
added p50 of a lease, three replicas' throughput at one capacity against one's, CPU per request
of the edges and of the store).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
HEADLINE_FIRST = "bench_proxy.py"
RESULTS = HERE / "results"


def scripts() -> list[Path]:
    """Every ``bench_*.py``, the proxy benchmark first."""
    found = sorted(HERE.glob("bench_*.py"))
    return sorted(found, key=lambda path: path.name != HEADLINE_FIRST)


def proxy_headline(since: float) -> str | None:
    """The headline table of the newest proxy benchmark result written after ``since``."""
    return newest_headline("proxy-*.json", since)


def newest_headline(pattern: str, since: float) -> str | None:
    """The ``headline_markdown`` of the newest result matching ``pattern`` (in ``RESULTS``)
    written after ``since``, and where it is."""
    written = [path for path in RESULTS.glob(pattern) if path.stat().st_mtime >= since]
    if not written:
        return None
    newest = max(written, key=lambda path: path.stat().st_mtime)
    try:
        text = json.loads(newest.read_text()).get("headline_markdown")
    except (OSError, ValueError):
        return None
    where = newest.relative_to(HERE.parent) if newest.is_relative_to(HERE.parent) else newest
    return f"{text}\n\n(from {where})" if text else None


def main() -> int:
    """Run each ``bench_*.py`` with this interpreter; fail if any fails."""
    started = time.time()
    failed = []
    for script in scripts():
        print(f"\n## {script.name}\n", flush=True)
        if subprocess.run([sys.executable, str(script)], check=False).returncode != 0:
            failed.append(script.name)
    headline = proxy_headline(started)
    print("\n## Headline\n")
    print(headline or "(the proxy benchmark wrote no result: see its output above)")
    surfaces = newest_headline("surfaces-*.json", started)
    print(f"\n{surfaces or '(the surfaces benchmark wrote no result: see its output above)'}")
    store = newest_headline("responses-store-*.json", started)
    print(f"\n{store or '(the responses store benchmark wrote no result: see its output above)'}")
    nodes = newest_headline("nodes-*.json", started)
    print(f"\n{nodes or '(the remote nodes benchmark wrote no result: see its output above)'}")
    shared = newest_headline("shared-*.json", started)
    print(f"\n{shared or '(the shared pool benchmark wrote no result: see its output above)'}")
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
