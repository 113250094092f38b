"""Per rank compute vs waiting, from the step records of the baseline and the slowed job;
:func:`analyse` turns a run's result into the one :class:`StragglerSummary` the files, the
console text and the page are built from. Pure but for reading the collected logs.

A step record's ``step_ms`` is the rank's whole step (forward, backward, optimizer) and
``comm_ms`` the time it then waited for the gradient allreduces to finish. The allreduce
completes only once *every* rank contributed its gradients, so that wait is time the rank spent
waiting for the slowest peer (plus the transfer itself): ``waiting = comm_ms`` and
``compute = step_ms - comm_ms``. A fast rank's step therefore grows to the straggler's step, the
difference showing up as waiting; the straggler itself waits for nobody.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from ddp.torchfree import RankLog, StepRecord, load_run
from lab.experiments import timeline
from lab.experiments.straggler.plan import BASELINE_JOB, SLOWED_JOB
from lab.experiments.straggler.result import StragglerResult
from lab.measure.windows import measured_steps, slowest_ms

__all__ = [
    "DEFINITIONS",
    "Figures",
    "JobStats",
    "RankRow",
    "StragglerSummary",
    "analyse",
    "job_stats",
    "summarize",
]

DEFINITIONS = {
    "compute": "step_ms - comm_ms: forward, backward and optimizer step, median over steps",
    "waiting": (
        "comm_ms: time after backward spent waiting for the gradient allreduces, which finish "
        "only when the slowest rank has contributed; median over steps"
    ),
    "step": "the rank's step_ms, median over the measured steps (warm-up steps left out)",
    "job step": "per step the slowest rank's step_ms (everyone waits for it), median over steps",
}


@dataclass(frozen=True)
class JobStats:
    """One job's medians: per rank (compute, waiting, step) and the job's step time."""

    compute_ms: dict[int, float]
    waiting_ms: dict[int, float]
    step_ms: dict[int, float]
    job_step_ms: float
    steps_measured: int


def job_stats(logs: Mapping[int, RankLog], warmup: int, where: str = "logs") -> JobStats:
    """Medians over the steps every rank logged after ``warmup``; ValueError if there are none."""
    steps = measured_steps(logs, warmup, where)
    mine: dict[int, list[StepRecord]] = {}
    for recs in steps.values():
        for r in recs:
            mine.setdefault(r.rank, []).append(r)

    def med(rank: int, f) -> float:
        return statistics.median(f(r) for r in mine[rank])

    ranks = sorted(mine)
    return JobStats(
        compute_ms={k: med(k, lambda r: r.step_ms - r.comm_ms) for k in ranks},
        waiting_ms={k: med(k, lambda r: r.comm_ms) for k in ranks},
        step_ms={k: med(k, lambda r: r.step_ms) for k in ranks},
        job_step_ms=statistics.median(slowest_ms(steps)),
        steps_measured=len(steps),
    )


@dataclass(frozen=True)
class RankRow:
    """One line of the table: a rank in the slowed job beside the same rank unslowed."""

    rank: int
    straggler: bool
    compute_ms: float
    waiting_ms: float
    step_ms: float
    baseline_compute_ms: float
    baseline_waiting_ms: float
    baseline_step_ms: float

    @property
    def vs_baseline(self) -> float:
        return self.step_ms / self.baseline_step_ms


@dataclass(frozen=True)
class Figures:
    """The per-rank table and the headline's figures."""

    rows: list[RankRow]
    job_step_ms: float
    baseline_job_step_ms: float
    straggler_compute_x: float  # the straggler's compute, slowed / unslowed: the real slowdown
    others_waiting_ms: float  # mean over the other ranks of their median waiting

    @property
    def job_x(self) -> float:
        return self.job_step_ms / self.baseline_job_step_ms


def summarize(baseline: JobStats, slowed: JobStats, straggler: int) -> Figures:
    """The table rows and headline figures; ValueError if the jobs' ranks differ."""
    if set(baseline.step_ms) != set(slowed.step_ms):
        raise ValueError(
            f"the jobs ran different ranks: {sorted(baseline.step_ms)} vs {sorted(slowed.step_ms)}"
        )
    rows = [
        RankRow(
            k,
            k == straggler,
            slowed.compute_ms[k],
            slowed.waiting_ms[k],
            slowed.step_ms[k],
            baseline.compute_ms[k],
            baseline.waiting_ms[k],
            baseline.step_ms[k],
        )
        for k in sorted(slowed.step_ms)
    ]
    others = [r.waiting_ms for r in rows if not r.straggler]
    return Figures(
        rows,
        slowed.job_step_ms,
        baseline.job_step_ms,
        slowed.compute_ms[straggler] / baseline.compute_ms[straggler],
        statistics.fmean(others) if others else 0.0,
    )


@dataclass
class StragglerSummary:
    """Everything ``lab straggler`` reports about one run: the figures, and one representative
    step of each job (unslowed first) for the trace and the Gantt chart; and the result."""

    result: StragglerResult
    figures: Figures
    steps: dict[str, int]  # job -> the step shown
    traced: list[timeline.StepTimeline]

    @property
    def broken(self) -> str:
        broken = [n for n, j in self.result.jobs.items() if not j.parity]
        return f"parity BROKEN in: {', '.join(broken)}" if broken else ""


def analyse(result: StragglerResult) -> StragglerSummary:
    """The run's summary from the collected logs; ValueError (LogError included) if they
    cannot give it."""
    plan = result.plan
    logs = {job: load_run(result.log_dir(job)) for job in (BASELINE_JOB, SLOWED_JOB)}
    stats = {job: job_stats(lg, plan.warmup, str(result.log_dir(job))) for job, lg in logs.items()}
    figures = summarize(stats[BASELINE_JOB], stats[SLOWED_JOB], plan.rank)
    titles = {BASELINE_JOB: "unslowed baseline", SLOWED_JOB: plan.describe()}
    steps, traced = {}, []
    for job, lg in logs.items():
        where = str(result.log_dir(job))
        steps[job] = timeline.representative_step(lg, plan.warmup, where)
        traced.append(timeline.load_step(lg, steps[job], titles[job], where))
    return StragglerSummary(result, figures, steps, traced)
