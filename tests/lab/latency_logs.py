"""Synthetic rank logs of ``python -m ddp train --log-dir``, written with ddp's own record
types and writer (``ddp.program.records``), for the latency report's tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ddp.program.records import ConfigRecord, EndRecord, RecordLog, StepRecord

__all__ = ["write_logs"]


def write_logs(
    log_dir: Path,
    *,
    world: int = 4,
    steps: int = 6,
    buckets: int = 3,
    step_ms: Callable[[int, int], float] = lambda rank, step: 100.0 + rank + step,
    sync: str = "allreduce",
    parity: bool = True,
    auto_cap: float | None = None,
) -> Path:
    """``rank<R>.jsonl`` per rank: a config record, a step record per step (with the bucket
    timeline when gradients are synchronised: bucket k in flight from 3+2k to 40+20k ms, so
    they overlap; with ``auto_cap``, step 2 carries the auto cap's choice, as on the step that
    rebuilt the buckets), an end record."""
    for rank in range(world):
        log = RecordLog(str(log_dir), rank)
        calls = buckets if sync == "allreduce" else 0
        log.write(ConfigRecord(rank, world, calls, 0, {"sync": sync}))
        for step in range(1, steps + 1):
            ms = step_ms(rank, step)
            timeline = {}
            if sync == "allreduce":
                timeline = {
                    "backward_ms": [2.0, 10.0],
                    "buckets_ms": [[3.0 + 2 * k, 40.0 + 20 * k] for k in range(buckets)],
                }
            if auto_cap is not None and step == 2:
                timeline["auto_cap"] = {"cap_mb": auto_cap, "link_latency_ms": 20.0}
            t0 = 1000.0 + step + rank * 0.002  # ranks start 2 ms apart
            log.write(StepRecord(rank, step, 1.0 / step, 42.0 + step, ms, ms / 2, t0, **timeline))
        log.write(EndRecord(rank, parity, "0" * 64))
        log.close()
    return log_dir
