"""Run every benchmark in bench/ in turn (``make bench``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    """Run each ``bench_*.py`` with this interpreter; fail if any fails."""
    failed = 0
    for script in sorted(HERE.glob("bench_*.py")):
        print(f"\n## {script.name}\n", flush=True)
        failed += subprocess.run([sys.executable, str(script)], check=False).returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
