"""``python -m lab``: see :mod:`lab.cli`."""

import sys

from lab.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
