"""Sections of a results page read from the ranks' typed records: how each rank ended and the
per-step figures. Any program that collects rank logs (``python -m ddp --log-dir``, the lab's
jobs) shows them the same way. Torch-free."""

from __future__ import annotations

from collections.abc import Mapping

from ddp.program.records import RankLog
from ddp.report.page import Table

__all__ = ["rank_exits", "rank_outcome", "steps_table"]


def rank_outcome(log: RankLog) -> str:
    """How a rank's log ends: its verdict, its diagnosis, or where it stopped."""
    if log.failure is not None:
        return f"failed: {log.failure.message}"
    if log.end is not None:
        if log.config is not None and log.config.config.get("sync") == "none":
            return "finished (no sync: the replicas drift apart by design)"
        return "finished, parity holds" if log.end.parity else "finished, parity BROKEN"
    last = log.steps[-1].step if log.steps else None
    where = "before its first step" if last is None else f"after step {last}"
    return f"stopped {where} without an end record" + (" (last line torn)" if log.torn else "")


def rank_exits(logs: Mapping[int, RankLog], codes: Mapping[int, int] | None = None) -> Table:
    """One row per rank: steps logged, the last one, its exit code (when known) and how it
    ended."""
    codes = codes or {}
    ranks = sorted(set(logs) | set(codes))
    rows = []
    for rank in ranks:
        log = logs.get(rank)
        steps = log.steps if log is not None else []
        rows.append(
            [
                rank,
                len(steps),
                steps[-1].step if steps else "-",
                codes.get(rank, "-"),
                rank_outcome(log) if log is not None else "no log collected",
            ]
        )
    return Table(("rank", "steps logged", "last step", "exit code", "how it ended"), rows)


def steps_table(logs: Mapping[int, RankLog], caption: str = "") -> Table:
    """Per step: the ranks' mean loss (the global batch's) and the reference's, |param diff|
    vs the reference (rank 0's), and the slowest rank's step and communication-wait times
    (the job waits for it)."""
    by_step: dict[int, list] = {}
    for log in logs.values():
        for r in log.steps:
            by_step.setdefault(r.step, []).append(r)
    rows = []
    for step, recs in sorted(by_step.items()):
        zero = next((r for r in recs if r.rank == 0), None)
        rows.append(
            [
                step,
                sum(r.loss for r in recs) / len(recs),
                zero.ref_loss if zero else None,
                zero.max_param_diff if zero else None,
                max(r.step_ms for r in recs),
                max(r.comm_ms for r in recs),
                len(recs),
            ]
        )
    headers = (
        "step",
        "mean loss",
        "ref loss",
        "max|dparam|",
        "step ms (slowest)",
        "comm wait ms (slowest)",
        "ranks",
    )
    return Table(headers, rows, caption)
