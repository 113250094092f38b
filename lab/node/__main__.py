"""``python -m lab.node``: see :mod:`lab.node.launcher`."""

import sys

from lab.node.launcher import main

if __name__ == "__main__":
    sys.exit(main())
