"""Per rank what each way of running the job held and moved, from the step records, the sampled
eth0 counters and the engine's memory figures; and how the limited jobs ended. :func:`analyse`
turns a run's result into the one :class:`MemorySummary` the files, the console text and the
page are built from. Pure but for reading the collected logs.

What is compared, DDP with Adam being 1.00x:

- optimizer state: the bytes of the optimizer's tensors on the rank that holds the most (a
  partition by whole parameters, as torch's ``ZeroRedundancyOptimizer`` makes, is uneven);
- link bytes: what every node's eth0 sent during the measured steps, summed, per step. Each
  step's window runs from its first rank's start to its last rank's end, so what the parity
  check moves between steps (the whole optimizer state, gathered on rank 0 to start the
  reference from) is left out: it is the check's, not the training's;
- step time: per step the slowest rank's ``step_ms`` (everyone waits for it), median.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

from ddp.torchfree import RankLog, load_run
from lab.experiments.memory.limit import REFERENCE_NODE, describe_limits
from lab.experiments.memory.plan import CONFIGS, DDP, LIMITED, SHARDED, TORCH_ZERO
from lab.experiments.memory.result import JobRun, MemoryResult
from lab.experiments.topology.wire import parse_samples, window_bytes

__all__ = [
    "DEFINITIONS",
    "JobFigures",
    "LimitOutcome",
    "MemorySummary",
    "RankRow",
    "Ratios",
    "analyse",
    "job_figures",
    "limit_outcome",
    "ratios",
]

DEFINITIONS = {
    "peak RSS": "the rank's process's peak resident set (ru_maxrss), from its last step record",
    "node peak": (
        "the container's memory high-water mark as the engine reports it (cgroup: the rank, "
        "its launcher, the page cache they read): what a memory limit is held against"
    ),
    "optimizer state": "bytes of the tensors in the optimizer's state (Adam: two per parameter)",
    "link": (
        "bytes the node's eth0 sent during the measured steps (each from its first rank's "
        "start to its last rank's end), per step"
    ),
    "step": "the rank's step_ms, median over the measured steps (warm-up steps left out)",
}
_MB = 1e6


@dataclass(frozen=True)
class RankRow:
    """One line of the table: one rank of one job."""

    job: str
    label: str
    rank: int
    peak_rss_mib: float | None
    node_peak_mib: float | None
    optimizer_state_mb: float | None
    link_mb_per_step: float
    step_ms: float


@dataclass(frozen=True)
class JobFigures:
    """One measured job: its ranks' rows and the job's figures."""

    name: str
    label: str
    rows: list[RankRow]
    job_step_ms: float
    link_mb_per_step: float  # every node's, summed
    steps_measured: int
    parity: bool

    @property
    def state_mb(self) -> float:
        """The largest rank's optimizer state (NaN when no rank reported one)."""
        states = [r.optimizer_state_mb for r in self.rows if r.optimizer_state_mb is not None]
        return max(states) if states else math.nan


def _steps(logs: Mapping[int, RankLog], warmup: int, where: str) -> list[int]:
    each = [{r.step for r in log.steps if r.step > warmup} for log in logs.values()]
    steps = sorted(set.intersection(*each)) if each else []
    if not steps:
        raise ValueError(
            f"{where}: no step after the {warmup} warm-up steps was logged by all "
            f"{len(logs)} ranks; run more --steps"
        )
    return steps


def job_figures(
    name: str,
    label: str,
    logs: Mapping[int, RankLog],
    counters: Mapping[int, str],
    memory: Mapping[int, float | None],
    warmup: int,
    parity: bool,
    where: str,
) -> JobFigures:
    """One job's figures from its rank logs, its nodes' eth0 samples (node = rank: one rank per
    node) and the engine's peak per node; ValueError naming ``where`` if they cannot give
    them."""
    if not logs:
        raise ValueError(f"{where}: no rank logs")
    steps = _steps(logs, warmup, where)
    measured = {k: [r for r in log.steps if r.step in steps] for k, log in logs.items()}
    spans = []
    for s in steps:
        recs = [r for rs in measured.values() for r in rs if r.step == s]
        if any(r.t0 is None for r in recs):
            raise ValueError(
                f"{where}: step records without wall clock (t0): a ddp older than this"
            )
        spans.append(
            (min(r.t0 for r in recs), max(r.t0 + r.step_ms / 1e3 for r in recs))  # type: ignore[operator]
        )
    samples = {n: parse_samples(text, f"{where} node{n}") for n, text in counters.items()}
    rows = []
    for rank in sorted(logs):
        recs = measured[rank]
        link = math.nan
        if rank in samples:
            sent = sum(window_bytes({rank: samples[rank]}, a, b, where).tx for a, b in spans)
            link = sent / len(steps) / _MB
        state = recs[-1].optimizer_state_bytes
        rss = [r.peak_rss_mib for r in logs[rank].steps if r.peak_rss_mib is not None]
        rows.append(
            RankRow(
                name,
                label,
                rank,
                max(rss) if rss else None,
                memory.get(rank),
                None if state is None else state / _MB,
                link,
                statistics.median(r.step_ms for r in recs),
            )
        )
    job_step = statistics.median(
        max(r.step_ms for recs in measured.values() for r in recs if r.step == s) for s in steps
    )
    return JobFigures(
        name,
        label,
        rows,
        job_step,
        sum(r.link_mb_per_step for r in rows),
        len(steps),
        parity,
    )


@dataclass(frozen=True)
class Ratios:
    """The sharded run's and torch's against DDP with Adam (1.00x)."""

    state_x: float
    link_x: float
    step_x: float
    torch_state_x: float
    torch_link_x: float
    torch_step_x: float


def _x(a: float, b: float) -> float:
    return a / b if b and math.isfinite(b) else math.nan


def ratios(jobs: Mapping[str, JobFigures]) -> Ratios:
    ddp, ours, torch = jobs[DDP.name], jobs[SHARDED.name], jobs[TORCH_ZERO.name]
    return Ratios(
        _x(ours.state_mb, ddp.state_mb),
        _x(ours.link_mb_per_step, ddp.link_mb_per_step),
        _x(ours.job_step_ms, ddp.job_step_ms),
        _x(torch.state_mb, ddp.state_mb),
        _x(torch.link_mb_per_step, ddp.link_mb_per_step),
        _x(torch.job_step_ms, ddp.job_step_ms),
    )


@dataclass(frozen=True)
class LimitOutcome:
    """How the two limited jobs ended under ``limits`` (node -> MiB)."""

    limits: dict[int, float]
    ddp: JobRun
    sharded: JobRun

    @property
    def ddp_killed(self) -> bool:
        """The engine reported an out-of-memory kill in at least one of DDP's nodes."""
        return bool(self.ddp.oom_nodes)

    @property
    def sharded_fits(self) -> bool:
        return self.sharded.finished and not self.sharded.oom_nodes

    @property
    def held(self) -> bool:
        return self.ddp_killed and self.sharded_fits

    def lines(self) -> list[str]:
        """What happened under the limit, one line per job."""
        limited = ", ".join(f"node{n}" for n in sorted(self.limits))
        lines = [
            f"memory limit {describe_limits(self.limits)} on {limited}, no swap (node"
            f"{REFERENCE_NODE}, which also trains the parity reference, unlimited)"
        ]
        for label, run in (("DDP + Adam", self.ddp), ("sharded", self.sharded)):
            if run.oom_nodes:
                where = ", ".join(f"node{n}" for n in run.oom_nodes)
                codes = ", ".join(
                    f"rank {k} exit {run.codes[k]}" if k in run.codes else f"rank {k} stopped"
                    for k in sorted(set(run.codes) | set(run.memory))  # a rank per node
                )
                lines.append(
                    f"{label}: killed for memory on {where} (the engine's oom event); {codes}"
                )
            elif run.finished:
                peaks = [m.peak_mib for m in run.memory.values() if m.peak_mib is not None]
                top = f", peak {max(peaks):.0f} MiB on its largest node" if peaks else ""
                lines.append(f"{label}: finished, parity holds{top}")
            else:
                lines.append(
                    f"{label}: did not finish (exits {run.codes}, parity "
                    f"{'holds' if run.parity else 'not confirmed'}), no oom event"
                )
        return lines


def limit_outcome(result: MemoryResult) -> LimitOutcome | None:
    """None when the limited jobs did not run."""
    names = [LIMITED[DDP.name], LIMITED[SHARDED.name]]
    if not result.limits or not all(n in result.jobs for n in names):
        return None
    return LimitOutcome(dict(result.limits), result.jobs[names[0]], result.jobs[names[1]])


@dataclass
class MemorySummary:
    """Everything ``lab memory`` reports about one run: the measured jobs' figures, the ratios
    and the limited jobs' outcome; and the result."""

    result: MemoryResult
    jobs: dict[str, JobFigures]
    ratios: Ratios
    limit: LimitOutcome | None
    notes: list[str] = field(default_factory=list)

    @property
    def broken(self) -> str:
        problems = [f"parity BROKEN in {n}" for n, j in self.jobs.items() if not j.parity]
        plan, result = self.result.plan, self.result
        if plan.limit:
            if self.limit is None:
                problems.append(f"no memory-limit run: {result.limit_error or 'did not run'}")
            else:
                if not self.limit.ddp_killed:
                    problems.append("DDP + Adam was NOT killed for memory under the limit")
                if not self.limit.sharded_fits:
                    problems.append("the sharded run did NOT finish under the limit")
        return "; ".join(problems)


def analyse(result: MemoryResult) -> MemorySummary:
    """The run's summary from the collected logs; ValueError (LogError included) if they
    cannot give it."""
    plan = result.plan
    jobs = {}
    for conf in CONFIGS:
        run = result.jobs.get(conf.name)
        if run is None:
            raise ValueError(f"job {conf.name} did not run")
        where = str(result.log_dir(conf.name))
        jobs[conf.name] = job_figures(
            conf.name,
            conf.label,
            load_run(result.log_dir(conf.name)),
            run.counters,
            {n: m.peak_mib for n, m in run.memory.items()},
            plan.warmup,
            run.parity,
            where,
        )
    return MemorySummary(result, jobs, ratios(jobs), limit_outcome(result))
