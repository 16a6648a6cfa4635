"""``python -m iop_edge.node``: the ``iop-node`` program (the same as the console script)."""

import sys

from iop_edge.node.program import main

if __name__ == "__main__":
    sys.exit(main())
