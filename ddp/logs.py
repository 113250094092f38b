"""Rank-aware logging and the per-rank JSON-lines log."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import IO

__all__ = ["JsonLog", "setup_logging"]

log = logging.getLogger("ddp")


def setup_logging(rank: int, all_ranks: bool = False) -> None:
    """Rank 0 prints; the others only warn, unless ``all_ranks`` (then lines carry the rank)."""
    fmt = f"[rank{rank}] %(message)s" if all_ranks else "%(message)s"
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(fmt))
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.INFO if rank == 0 or all_ranks else logging.WARNING)


class JsonLog:
    """``<log_dir>/rank<R>.jsonl``, flushed per line so a killed rank leaves what it did."""

    def __init__(self, log_dir: str | None, rank: int) -> None:
        self._f: IO[str] | None = None
        if log_dir:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            self._f = open(Path(log_dir) / f"rank{rank}.jsonl", "w")  # noqa: SIM115

    def write(self, **record: object) -> None:
        if self._f is not None:
            self._f.write(json.dumps(record) + "\n")
            self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
