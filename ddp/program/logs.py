"""Rank-aware logging: rank 0 prints, the others only warn unless asked."""

from __future__ import annotations

import logging
import sys

__all__ = ["setup_logging"]

log = logging.getLogger("ddp")


def setup_logging(rank: int, all_ranks: bool = False) -> None:
    """Rank 0 prints; the others only warn, unless ``all_ranks`` (then lines carry the rank).
    The table and progress go to stdout, warnings and errors (diagnoses) to stderr."""
    fmt = logging.Formatter(f"[rank{rank}] %(message)s" if all_ranks else "%(message)s")
    out = logging.StreamHandler(sys.stdout)
    out.addFilter(lambda r: r.levelno < logging.WARNING)
    err = logging.StreamHandler(sys.stderr)
    err.setLevel(logging.WARNING)
    for handler in (out, err):
        handler.setFormatter(fmt)
    log.handlers[:] = [out, err]
    log.propagate = False
    log.setLevel(logging.INFO if rank == 0 or all_ranks else logging.WARNING)
