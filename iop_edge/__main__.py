"""``python -m iop_edge``: the ``iop-edge`` command line (the same as the console script)."""

import sys

# iop_edge.cli first: it installs the early SIGHUP handler of `serve` before anything slow.
from iop_edge.cli import main

if __name__ == "__main__":
    sys.exit(main())
