"""``lab topology``'s figures from the rank logs (``ddp.torchfree.RankLog``) and the sampled
eth0 counters: one row per configuration, pooled over its rounds, compared with torch's DDP;
:func:`analyse` turns a run's result into the one :class:`TopologySummary` the files, the
console text and the page are built from. Pure but for reading the collected logs: tested from
synthetic logs and samples.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ddp.torchfree import RankLog, load_run
from lab.experiments.compress.analysis import job_figures
from lab.experiments.topology.plan import BASELINE, Configuration
from lab.experiments.topology.result import ConfigRun, TopologyResult
from lab.experiments.topology.wire import Sample, Window, parse_samples, window_bytes

__all__ = [
    "DEFINITIONS",
    "JobFigures",
    "Row",
    "TopologySummary",
    "analyse",
    "combine_rounds",
    "derive_rows",
    "job",
    "make_row",
]

Logs = Mapping[int, RankLog]

DEFINITIONS = {
    "median step ms": (
        "per measured step (warm-up excluded) the slowest rank's step_ms, since the job waits "
        "for it; the median over the steps of every round"
    ),
    "per round": "each round's own median: how much the shared host's load moved it",
    "cross-node MB/step": (
        "measured: the bytes every node's eth0 sent (summed over the nodes; ranks of one node "
        "talk over loopback, so this is the link between the nodes), sampled every 10 ms and "
        "cut to the measured steps (from the first one's start to the last one's end, by the "
        "step records' wall clocks), divided by their number; gradients, per-step gathers and "
        "TCP/IP headers alike"
    ),
    "buckets": "rank 0's allreduce calls in the last measured step (the auto cap's choice shows)",
    "speedup vs torch DDP": "torch's median step time divided by this configuration's",
    "max |dparam|": (
        "ddp's verdict figure: the largest parameter difference from the exact single process "
        "over all steps; float rounding for the exact configurations, the price for fp16"
    ),
    "parity": "ddp's verdict in every round: replicas identical (and exact where exact)",
}


@dataclass(frozen=True)
class JobFigures:
    """What one job's logs and samples say."""

    step_ms: list[float]  # measured steps' slowest-rank times
    steps: int  # measured steps
    window: Window | None  # what crossed the link during them (None: not sampled)
    buckets: int | None
    max_param_diff: float | None
    auto_cap_mb: float | None = None  # bucket_cap_mb="auto": the cap it chose


def _measured_span(logs: Logs, warmup: int, where: str) -> tuple[float, float, int]:
    """Wall clock from the first measured step's start to the last one's end (every rank's),
    and the number of steps between."""
    each = [{r.step for r in log.steps if r.step > warmup} for log in logs.values()]
    steps = sorted(set.intersection(*each))  # job_figures made sure there are some
    recs = [r for log in logs.values() for r in log.steps if r.step in (steps[0], steps[-1])]
    if any(r.t0 is None for r in recs):
        raise ValueError(f"{where}: step records without wall clock (t0): a ddp older than this")
    start = min(r.t0 for r in recs if r.step == steps[0])
    end = max(r.t0 + r.step_ms / 1e3 for r in recs if r.step == steps[-1])
    return start, end, len(steps)


def job(logs: Logs, samples: Mapping[int, Sequence[Sample]], warmup: int, where: str) -> JobFigures:
    """ValueError naming ``where`` if the logs or samples cannot give the figures."""
    figures = job_figures(logs, warmup, where)  # checks the logs, the complete steps
    start, end, steps = _measured_span(logs, warmup, where)
    window = window_bytes(samples, start, end, where) if samples else None
    last = [r for r in logs[min(logs)].steps if r.step > warmup]
    buckets = last[-1].num_buckets if last else None
    auto = logs[min(logs)].auto_cap_mb
    return JobFigures(figures.step_ms, steps, window, buckets, figures.max_param_diff, auto)


@dataclass(frozen=True)
class Row:
    """One line of the table / CSV: a configuration over its rounds."""

    config: str  # Configuration.name
    label: str
    median_step_ms: float
    round_step_ms: tuple[float, ...]
    steps_measured: int
    cross_mb_per_step: float  # NaN: not sampled
    buckets: int | None
    max_param_diff: float  # NaN: no reference
    parity: bool
    speedup_vs_torch: float = math.nan
    step_time_vs_torch: float = math.nan  # the headline's ratio: < 1 is faster
    auto_caps: tuple[float, ...] = ()  # the auto cap's choice, per round

    @property
    def title(self) -> str:
        """How the table names it: torch's DDP, or ours."""
        return f"{self.label} (flat ring)" if self.config == BASELINE.name else f"ours {self.label}"


def make_row(conf: Configuration, jobs: Sequence[JobFigures], parity: bool) -> Row:
    windows = [j.window for j in jobs if j.window is not None]
    sampled_steps = sum(j.steps for j in jobs if j.window is not None)
    cross = sum(w.tx for w in windows) / sampled_steps / 1e6 if windows else math.nan
    diffs = [j.max_param_diff for j in jobs if j.max_param_diff is not None]
    return Row(
        conf.name,
        conf.label,
        statistics.median(ms for j in jobs for ms in j.step_ms),
        tuple(statistics.median(j.step_ms) for j in jobs),
        sum(len(j.step_ms) for j in jobs),
        cross,
        jobs[-1].buckets,
        max(diffs) if diffs else math.nan,
        parity,
        auto_caps=tuple(j.auto_cap_mb for j in jobs if j.auto_cap_mb is not None),
    )


def derive_rows(rows: list[Row]) -> list[Row]:
    """Fill the comparison with torch's DDP."""
    base = next((r for r in rows if r.config == BASELINE.name), None)
    if base is None:
        return rows
    return [
        dataclasses.replace(
            r,
            speedup_vs_torch=base.median_step_ms / r.median_step_ms,
            step_time_vs_torch=r.median_step_ms / base.median_step_ms,
        )
        for r in rows
    ]


def _job(result: TopologyResult, run: ConfigRun) -> JobFigures:
    where = str(result.log_dir(run))
    samples = {n: parse_samples(text, f"{where} node{n}") for n, text in run.counters.items()}
    return job(load_run(result.log_dir(run)), samples, result.plan.warmup, where)


def combine_rounds(result: TopologyResult) -> tuple[list[Row], dict[str, JobFigures]]:
    """One row per configuration, in plan order, its steps pooled over its rounds; and every
    job's figures by job name."""
    jobs = {run.job: _job(result, run) for run in result.runs}
    rows = []
    for conf in result.plan.configurations:
        runs = [run for run in result.runs if run.conf == conf.name]
        if runs:
            parity = all(run.parity for run in runs)
            rows.append(make_row(conf, [jobs[run.job] for run in runs], parity))
    return derive_rows(rows), jobs


@dataclass
class TopologySummary:
    """Everything ``lab topology`` reports about one run: the rows, every job's figures (by
    job name); and the result they came from."""

    result: TopologyResult
    rows: list[Row]
    jobs: dict[str, JobFigures]

    @property
    def broken(self) -> str:
        broken = [r.title for r in self.rows if not r.parity]
        return f"parity BROKEN in: {'; '.join(broken)}" if broken else ""


def analyse(result: TopologyResult) -> TopologySummary:
    """The run's summary from the collected logs and samples; ValueError if they cannot give
    it."""
    rows, jobs = combine_rounds(result)
    return TopologySummary(result, rows, jobs)
