"""``lab topology``'s figures from the rank logs (``ddp.torchfree.RankLog``) and the sampled
eth0 counters: per layout one row per configuration, pooled over its rounds, compared with
torch's DDP and with the limit (its network cost); with a link change, each row's steps before
and after it and how many it took to recover (:func:`lab.experiments.link_change.recovery`).
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
from lab.experiments.link_change import (
    RECOVER_LAST,
    RECOVER_WITHIN,
    LinkChange,
    Recovery,
    StepPoint,
    recovery,
    step_points,
)
from lab.experiments.topology.plan import BASELINE, LIMIT, Configuration
from lab.experiments.topology.result import ConfigRun, TopologyResult
from lab.experiments.topology.wire import Sample, Window, parse_samples, window_bytes

__all__ = [
    "DEFINITIONS",
    "JobFigures",
    "LayoutRows",
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
    "buckets": "rank 0's allreduce calls in the last measured step (comm auto's choice shows)",
    "limit": (
        "torch's DDP at the same cap on the bare link (the shaping cleared for it, then "
        "shaped and verified again), in the same run: what every row's network cost is "
        "measured from; a row at or under it pays nothing for the shaped link (within the "
        "host's noise: ours sends fewer bytes than torch's ring on the bridge too)"
    ),
    "network ms": "the median step time minus the limit's: what the link costs this row",
    "net vs torch": "this row's network ms divided by torch DDP's: ours as a fraction of torch's",
    "vs torch": "the median step time divided by torch DDP's (< 1 is faster)",
    "vs limit": "the median step time divided by the limit's",
    "steps to recover": (
        "with --change-at-step: counted from the first step that started after the new link "
        "was in place on every node, the steps until every step from there to the end stays "
        f"within {RECOVER_WITHIN:.0%} of the row's settled level, the median of its last "
        f"{RECOVER_LAST} steps (0: at once; '-': it never settled); one figure per round"
    ),
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
    points: tuple[StepPoint, ...] = ()  # every step all ranks logged, warm-up included
    plans: tuple[dict, ...] = ()  # rank 0's comm auto "plan" records, as written
    recovery: Recovery | None = None  # the link changed during the job


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


def _plans(log: RankLog) -> tuple[dict, ...]:
    """Rank 0's "plan" records (comm auto's choices), as plain dicts: read by event name, so a
    ddp without them reads as none."""
    return tuple(dataclasses.asdict(r) for r in log.records if getattr(r, "event", None) == "plan")


def job(
    logs: Logs,
    samples: Mapping[int, Sequence[Sample]],
    warmup: int,
    where: str,
    change: LinkChange | None = None,
) -> JobFigures:
    """ValueError naming ``where`` if the logs or samples cannot give the figures."""
    figures = job_figures(logs, warmup, where)  # checks the logs, the complete steps
    start, end, steps = _measured_span(logs, warmup, where)
    window = window_bytes(samples, start, end, where) if samples else None
    last = [r for r in logs[min(logs)].steps if r.step > warmup]
    buckets = last[-1].num_buckets if last else None
    auto = logs[min(logs)].auto_cap_mb
    points = step_points(logs)
    changed = None
    if change is not None:
        changed = recovery(points, change.asked_step, change.applied_t, warmup)
    return JobFigures(
        figures.step_ms,
        steps,
        window,
        buckets,
        figures.max_param_diff,
        auto,
        tuple(points),
        _plans(logs[min(logs)]),
        changed,
    )


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
    layout: str = "2x2"  # Layout.name
    network_ms: float = math.nan  # median step minus the limit's
    network_vs_torch: float = math.nan  # network_ms / torch's
    step_time_vs_limit: float = math.nan
    # with a link change, per round: the recovery figures (Recovery), and pooled their medians
    recoveries: tuple[Recovery, ...] = ()
    plans: tuple[dict, ...] = ()  # comm auto's plan records, rank 0, the last round's

    @property
    def title(self) -> str:
        """How the table names it: torch's DDP, the limit, or ours."""
        if self.config == BASELINE.name:
            return f"{self.label} (flat ring)"
        if self.config == LIMIT.name:
            return "limit (torch DDP, bare link)"
        return f"ours {self.label}"

    @property
    def before_ms(self) -> float:
        return _median([r.before_ms for r in self.recoveries])

    @property
    def after_ms(self) -> float:
        return _median([r.after_ms for r in self.recoveries])

    @property
    def steps_to_recover(self) -> tuple[int | None, ...]:
        return tuple(r.steps_to_recover for r in self.recoveries)


def _median(values: Sequence[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return statistics.median(kept) if kept else math.nan


def make_row(
    conf: Configuration, jobs: Sequence[JobFigures], parity: bool, layout: str = "2x2"
) -> Row:
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
        layout=layout,
        recoveries=tuple(j.recovery for j in jobs if j.recovery is not None),
        plans=jobs[-1].plans,
    )


def derive_rows(rows: list[Row]) -> list[Row]:
    """Fill the comparisons of one layout's rows with torch's DDP and with the limit: the
    ratios of step times, and each row's network cost (its step minus the limit's) with ours
    as a fraction of torch's."""
    base = next((r for r in rows if r.config == BASELINE.name), None)
    limit = next((r for r in rows if r.config == LIMIT.name), None)
    out = []
    for r in rows:
        ch: dict[str, float] = {}
        if base is not None:
            ch["speedup_vs_torch"] = base.median_step_ms / r.median_step_ms
            ch["step_time_vs_torch"] = r.median_step_ms / base.median_step_ms
        if limit is not None:
            ch["network_ms"] = r.median_step_ms - limit.median_step_ms
            ch["step_time_vs_limit"] = r.median_step_ms / limit.median_step_ms
            if base is not None and base.median_step_ms > limit.median_step_ms:
                torch_net = base.median_step_ms - limit.median_step_ms
                ch["network_vs_torch"] = ch["network_ms"] / torch_net
        out.append(dataclasses.replace(r, **ch))
    return out


def _job(result: TopologyResult, run: ConfigRun) -> JobFigures:
    where = str(result.log_dir(run))
    samples = {n: parse_samples(text, f"{where} node{n}") for n, text in run.counters.items()}
    return job(load_run(result.log_dir(run)), samples, result.plan.warmup, where, run.change)


@dataclass(frozen=True)
class LayoutRows:
    """One layout's table: ``layout`` (Layout.name), its description and rows in plan order."""

    layout: str
    title: str
    rows: list[Row]

    def row(self, config: str) -> Row | None:
        return next((r for r in self.rows if r.config == config), None)


def combine_rounds(result: TopologyResult) -> tuple[list[LayoutRows], dict[str, JobFigures]]:
    """Per layout, one row per configuration, in plan order, its steps pooled over its rounds;
    and every job's figures by job name."""
    jobs = {run.job: _job(result, run) for run in result.runs}
    tables = []
    for lay in result.plan.layouts:
        rows = []
        for conf in result.plan.configurations(lay):
            runs = [r for r in result.runs if r.conf == conf.name and r.layout == lay.name]
            if runs:
                parity = all(run.parity for run in runs)
                figures = [jobs[run.job] for run in runs]
                rows.append(make_row(conf, figures, parity, lay.name))
        if rows:
            tables.append(LayoutRows(lay.name, lay.describe(), derive_rows(rows)))
    return tables, jobs


@dataclass
class TopologySummary:
    """Everything ``lab topology`` reports about one run: the rows, every job's figures (by
    job name); and the result they came from."""

    result: TopologyResult
    layouts: list[LayoutRows]
    jobs: dict[str, JobFigures]

    @property
    def rows(self) -> list[Row]:
        """Every layout's rows, layout by layout."""
        return [r for lay in self.layouts for r in lay.rows]

    @property
    def broken(self) -> str:
        several = len(self.layouts) > 1
        broken = [
            f"{r.title}{f' ({r.layout})' if several else ''}" for r in self.rows if not r.parity
        ]
        return f"parity BROKEN in: {'; '.join(broken)}" if broken else ""


def analyse(result: TopologyResult) -> TopologySummary:
    """The run's summary from the collected logs and samples; ValueError if they cannot give
    it."""
    layouts, jobs = combine_rounds(result)
    return TopologySummary(result, layouts, jobs)
