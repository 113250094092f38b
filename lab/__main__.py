"""``python -m lab``: see :mod:`lab.cli`.

The lab's dependencies (the docker SDK, PyYAML, psutil, tqdm, matplotlib) are the ``[lab]``
extra, not the core install; without them this says so in one line instead of a traceback.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence

__all__ = ["main"]

_LAB_EXTRA = ("docker", "yaml", "psutil", "tqdm", "matplotlib")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the lab's command line, or exit 2 naming what is missing and how to install it."""
    missing = [name for name in _LAB_EXTRA if importlib.util.find_spec(name) is None]
    if missing:
        print(
            f"error: the lab needs its extra (missing: {', '.join(missing)}): "
            "pip install -c constraints.txt -e '.[lab]'",
            file=sys.stderr,
        )
        return 2
    from lab.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
