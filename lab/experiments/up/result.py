"""What a ``lab up`` run produced, as plain data: exits, resources, the verdict re-judged from
the collected logs. Plain data, so the report and its tests build on it without a run."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lab.experiments.up.plan import UpPlan

if TYPE_CHECKING:
    from lab.engine.stats import ResourceSampler

__all__ = ["JOB", "UpResult"]

JOB = "train"  # the job's name: runs/<run-id>/train/


@dataclass
class UpResult:
    plan: UpPlan
    run_id: str
    run_dir: Path
    codes: dict[int, int]
    usage: dict[int, tuple[float | None, float | None]]  # rank -> (CPU s, peak RSS MiB)
    holds: bool
    verdict: str
    training_s: float  # from the first rank's set-up record to the last exit
    total_s: float  # containers created to removed
    sampler: ResourceSampler
    # node -> the ranks that reported from it (torchrun assigns them; file: the layout's)
    placement: dict[int, list[int]] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.holds and all(code == 0 for code in self.codes.values())
