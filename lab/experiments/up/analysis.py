"""``lab up``'s summary: the run's result (exits, resources, the verdict re-judged from the
collected logs) with the ranks' records and the median step time read from them. The
``summary.json``, the console text and the page are each built from it."""

from __future__ import annotations

from dataclasses import dataclass

from ddp.torchfree import RankLog
from lab.experiments.up.result import JOB, UpResult
from lab.report.common import job_logs, median_step_ms

__all__ = ["UpSummary", "analyse"]


@dataclass
class UpSummary:
    result: UpResult
    logs: dict[int, RankLog]  # the job's collected records, by rank ({} when unreadable)
    median_step_ms: float | None  # the slowest rank's, median over steps; None: no steps

    @property
    def ok(self) -> bool:
        return self.result.ok


def analyse(result: UpResult) -> UpSummary:
    logs, _ = job_logs(result.run_dir, JOB)  # the page says what is wrong with them
    return UpSummary(result, logs, median_step_ms(logs))
