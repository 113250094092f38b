"""The parity table and verdict: does DDP equal one process training on the global batch?

Two checks per step. Replicas: every rank's parameter checksum must be bitwise equal (they
applied the same averaged gradients to the same weights). Reference: after each step, rank 0's
parameters must be within ``tolerance`` of a single process that took the same step from the
same weights on the concatenation of all ranks' batches (averaging order differs, so only float
rounding may differ; why per step: ``reference``). With compression the reference trains on
its own and the difference is reported as the price, not judged.

Live runs and ``check_logs`` (a collected run, offline) build the same ``StepRow``s and share
one judge, so the verdict a container printed can be re-derived from its logs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ddp.program.records import StepRecord, load_run
from ddp.wrapper.hook_names import EXACT_HOOKS

__all__ = ["ParityReport", "StepRow", "check_logs", "compression_of"]

HEADER = (
    " step   ref loss   ddp loss     ref checksum     ddp checksum  max|dparam|  replicas"
    "   step ms   comm ms"
)


@dataclass
class StepRow:
    step: int
    loss: float  # mean over ranks of the local losses
    checksums: list[float]  # per rank, float64 sum of all parameters after the step
    ref_loss: float | None = None
    ref_checksum: float | None = None
    max_param_diff: float | None = None
    step_ms: float = 0.0
    comm_ms: float = 0.0

    @property
    def replicas_equal(self) -> bool:
        return len(set(self.checksums)) == 1

    def format(self) -> str:
        def num(v: float | None, fmt: str, width: int) -> str:
            return f"{v:{width}{fmt}}" if v is not None else f"{'-':>{width}}"

        return (
            f"{self.step:5d}  {num(self.ref_loss, '.6f', 9)}  {self.loss:9.6f}  "
            f"{num(self.ref_checksum, '.6f', 15)}  {self.checksums[0]:15.6f}  "
            f"{num(self.max_param_diff, '.1e', 11)}  "
            f"{'same' if self.replicas_equal else 'DIFFER':>8}  {self.step_ms:8.1f}  "
            f"{self.comm_ms:8.1f}"
        )


@dataclass
class ParityReport:
    rows: list[StepRow]
    world_size: int
    tolerance: float = 1e-5
    expected_steps: int | None = None
    problems: list[str] = field(default_factory=list)  # e.g. missing logs
    # A compressing comm hook (fp16, bf16, powersgd) changes the numbers by design: replicas
    # must still be identical, but the distance to the exact single-process run is reported,
    # not judged against ``tolerance``.
    compression: str | None = None

    def _first_failure(self) -> str | None:
        if self.problems:
            return "; ".join(self.problems)
        if not self.rows:
            return "no training steps were recorded"
        if self.expected_steps is not None and len(self.rows) < self.expected_steps:
            return f"only {len(self.rows)} of {self.expected_steps} steps were recorded"
        for r in self.rows:
            if len(r.checksums) != self.world_size:
                return f"step {r.step}: {len(r.checksums)} of {self.world_size} ranks reported"
            if not r.replicas_equal:
                return (
                    f"replicas diverged at step {r.step} (checksums "
                    f"{min(r.checksums):.6f} .. {max(r.checksums):.6f} differ across ranks)"
                )
            diff = r.max_param_diff
            if diff is not None and not math.isfinite(diff):
                return f"step {r.step}: parameters are no longer finite ({diff})"
            if self.compression is None and diff is not None and not diff <= self.tolerance:
                return (
                    f"step {r.step}: parameters differ from the single-process reference by "
                    f"{diff:.2e} > {self.tolerance:.0e}"
                )
        return None

    @property
    def holds(self) -> bool:
        return self._first_failure() is None

    @property
    def verdict(self) -> str:
        failure = self._first_failure()
        if failure is not None:
            return f"parity broken: {failure}"
        diffs = [r.max_param_diff for r in self.rows if r.max_param_diff is not None]
        if not diffs:
            against = "no single-process reference was run"
        elif self.compression is not None:
            against = (
                f"{self.compression} compression on: max |param diff| vs the exact single "
                f"process {max(diffs):.1e} (the price of compressing; not judged against "
                f"{self.tolerance:.0e})"
            )
        else:
            against = (
                f"max |param diff| vs single process {max(diffs):.1e} <= {self.tolerance:.0e} "
                "(each step from the same weights)"
            )
        return (
            f"parity holds: {self.world_size} replicas identical after all {len(self.rows)} "
            f"steps, {against}"
        )

    def table(self) -> str:
        return "\n".join([HEADER, *(r.format() for r in self.rows)])


def check_logs(log_dir: Path) -> ParityReport:
    """Re-judge a collected run from its per-rank logs (``rank<R>.jsonl``)."""
    log_dir = Path(log_dir)
    if not log_dir.is_dir():
        raise FileNotFoundError(f"{log_dir} not found: pass the directory of a run's logs")
    by_rank = load_run(log_dir)
    if not by_rank:
        raise FileNotFoundError(
            f"no rank*.jsonl logs in {log_dir}: pass the run's log directory "
            "(python -m ddp --log-dir DIR, or runs/<run-id>/ of python -m lab)"
        )
    config = by_rank[0].config if 0 in by_rank else None
    world = config.world_size if config else len(by_rank)
    problems = [f"no log from rank {r}" for r in range(world) if r not in by_rank]
    steps: dict[int, dict[int, StepRecord]] = {}
    for rank, log in by_rank.items():
        for rec in log.steps:
            steps.setdefault(rec.step, {})[rank] = rec
    rows = []
    for step in sorted(steps):
        recs = steps[step]
        ranks = sorted(recs)
        r0 = recs.get(0)
        rows.append(
            StepRow(
                step=step,
                loss=sum(recs[r].loss for r in ranks) / len(ranks),
                checksums=[recs[r].checksum for r in ranks],
                ref_loss=r0.ref_loss if r0 else None,
                ref_checksum=r0.ref_checksum if r0 else None,
                max_param_diff=r0.max_param_diff if r0 else None,
                step_ms=max(recs[r].step_ms for r in ranks),
                comm_ms=max(recs[r].comm_ms for r in ranks),
            )
        )
    return ParityReport(
        rows=rows,
        world_size=world,
        tolerance=float(config.config.get("tolerance", 1e-5)) if config else 1e-5,
        expected_steps=config.config["steps"] - config.start_step if config else None,
        problems=problems,
        compression=compression_of(config.config) if config else None,
    )


def compression_of(config: dict) -> str | None:
    """The compressing comm hook a run's config names, or None for an exact one (``none``,
    ``hierarchical``: only the order of float sums differs, so parity is judged)."""
    hook = config.get("comm_hook", "none")
    return None if hook in EXACT_HOOKS else hook
