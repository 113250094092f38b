"""Rank-aware logging: rank 0 prints, the others only warn unless asked."""

from __future__ import annotations

import logging
import sys

__all__ = ["setup_logging"]

log = logging.getLogger("ddp")


def setup_logging(rank: int, all_ranks: bool = False) -> None:
    """Rank 0 prints; the others only warn, unless ``all_ranks`` (then lines carry the rank)."""
    fmt = f"[rank{rank}] %(message)s" if all_ranks else "%(message)s"
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(fmt))
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.INFO if rank == 0 or all_ranks else logging.WARNING)
