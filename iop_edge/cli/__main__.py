"""``python -m iop_edge.cli``: the ``iop-edge`` command line, as ``python -m iop_edge``."""

import sys

from iop_edge.cli import main

if __name__ == "__main__":
    sys.exit(main())
