"""Lab commands that are not experiments (same shape, see :mod:`lab.experiments.base`)."""

from __future__ import annotations

__all__ = ["TOOLS"]

TOOLS = ("image", "down", "parity", "compose", "stack", "runs", "engines")  # lab.tools.<name>
