"""What one job's rank logs say, before an experiment compares it with its other jobs: the
measured steps' job-wide times, the final loss beside the exact reference's, ddp's largest
parameter difference, and the buckets the ranks reported.

Why here and not in an experiment: ``compress`` and ``topology`` both read a job this way, and
one experiment reaching into another's analysis ties the two together; the figures are a
measurement, like the measured window they are taken over (:mod:`.windows`). Pure: it reads
logs already loaded.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from ddp.torchfree import RankLog
from lab.measure.windows import measured_steps, slowest_ms

__all__ = ["JobFigures", "job_figures"]


@dataclass(frozen=True)
class JobFigures:
    """What one job's logs say, before comparing it with the other hooks."""

    step_ms: list[float]  # the measured steps' slowest-rank times
    final_loss: float
    ref_final_loss: float | None
    max_param_diff: float | None
    world_size: int
    bucket_shapes: list[list[list[int]]] | None


def job_figures(logs: Mapping[int, RankLog], warmup: int, where: str) -> JobFigures:
    """ValueError naming ``where`` if the logs cannot give the figures."""
    if not logs:
        raise ValueError(f"{where}: no rank logs")
    configs = [log.config for log in logs.values()]
    if any(c is None for c in configs):
        raise ValueError(f"{where}: a rank log has no config record (did the rank start?)")
    complete = measured_steps(logs, warmup, where)
    measured = slowest_ms(complete)
    last = complete[max(complete)]
    ref = [r for r in last if r.ref_loss is not None]
    diffs = [
        r.max_param_diff for log in logs.values() for r in log.steps if r.max_param_diff is not None
    ]
    first = configs[0]
    assert first is not None
    return JobFigures(
        step_ms=measured,
        final_loss=statistics.fmean(r.loss for r in last),
        ref_final_loss=ref[0].ref_loss if ref else None,
        max_param_diff=max(diffs) if diffs else None,
        world_size=first.world_size,
        bucket_shapes=first.bucket_shapes,
    )
