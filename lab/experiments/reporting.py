"""What every sweep's ``report`` does around its own table: write the figures from the
collected logs (or say, without a traceback, why the logs cannot give them, and where they
are), then one line of how long the run took and which files it wrote."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["written", "wrote_line"]

Out = TypeVar("Out")


def written(write_outputs: Callable[[Any], Out], result: Any) -> Out | None:
    """``write_outputs(result)``, or None after printing why it failed (a ValueError, LogError
    included: the logs cannot give the figures); the caller then exits 1."""
    try:
        return write_outputs(result)
    except ValueError as e:
        print(f"error: {e} (the logs are in {result.run_dir}/)", file=sys.stderr)
        return None


def wrote_line(result: Any, files: Sequence[Path], took: str = "took") -> str:
    names = ", ".join(f.name for f in files)
    return f"{took} {result.seconds:.0f} s; wrote {result.run_dir}/: {names}"
