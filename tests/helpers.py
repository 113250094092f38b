"""The one way multi-rank tests start ranks: real gloo processes, a file:// rendezvous under the
test's tmp_path, and a hard deadline so a regression fails instead of hanging."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddp.launch import spawn_ranks

__all__ = ["run_ranks"]


def run_ranks(
    fn: Callable[..., Any], world_size: int, tmp_path: Path, *args: Any, timeout_s: float = 90
) -> dict[int, Any]:
    """``fn(rendezvous, *args)`` on every rank (``fn`` must live in an importable module)."""
    return spawn_ranks(fn, world_size, *args, rendezvous_dir=str(tmp_path), timeout_s=timeout_s)
