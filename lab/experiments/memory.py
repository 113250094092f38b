"""``python -m lab memory``: sharding the optimizer state (ZeRO stage 1) divides the state every
rank holds and moves the bytes DDP moves; whether that lets a job fit where DDP with Adam is
killed for memory is what the limited jobs measure.

The same job runs three ways, each in fresh containers, one rank each: our DDP with Adam, ours
with the optimizer state sharded (each rank keeps Adam's moments for its shard only), and
torch's DDP with torch's ``ZeroRedundancyOptimizer``. Per rank: the peak memory (the process's
RSS, the container's high-water mark), the optimizer state's bytes, the bytes on the link per
step and the step time. Then, under a container memory limit between the sharded run's peak and
DDP's, both run again: DDP with Adam should be killed by the kernel for memory (the engine's
oom event names it) and the sharded run finish with parity against the single process.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import statistics
import textwrap
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddp.torchfree import RankLog, Section, Table, Text, TrainConfig, config_from_args, load_run
from lab import args as common
from lab.args import check_job, check_warmup
from lab.engine.client import RunTimeout, connect
from lab.engine.cluster import Cluster
from lab.engine.layout import Layout
from lab.engine.memory import oom_kills, peak_mib, set_limit
from lab.engine.specs import DEFAULT_IMAGE, new_run_id
from lab.experiments.followed import FAIL_GRACE_S, check_finished, holds, train_followed
from lab.experiments.sweep import lifetime
from lab.measure.counters import parse_samples, sampled, window_bytes
from lab.measure.windows import measured_steps, slowest_ms
from lab.report.report import Closing
from lab.report.report import report as report_sweep
from lab.report.results import Results, sweep_results

__all__ = [
    "CONFIGS",
    "DDP",
    "DEFINITIONS",
    "LIMITED",
    "LIMIT_AT",
    "MIN_GAP_MIB",
    "QUICK_STEPS",
    "REFERENCE_NODE",
    "SHARDED",
    "TORCH_ZERO",
    "TRAIN_DEFAULTS",
    "Config",
    "JobFigures",
    "JobRun",
    "LimitOutcome",
    "MemoryPlan",
    "MemoryResult",
    "MemorySummary",
    "NodeMemory",
    "RankRow",
    "Ratios",
    "add_arguments",
    "analyse",
    "choose_limits",
    "closing",
    "describe_limits",
    "format_table",
    "headline_line",
    "job_figures",
    "limit_outcome",
    "page",
    "plan",
    "ratios",
    "report",
    "run",
    "write_files",
]


# ------------------------------------------------------------------------------------------
# ``lab memory``'s plan: the one job it runs three ways (our DDP with Adam, ours with the
# optimizer state sharded, torch's DDP with torch's ``ZeroRedundancyOptimizer``), then twice more
# under a container memory limit, validated before any container exists. Pure: tested without
# Docker.
#
# Every job runs in a fresh set of containers, one rank each: a container's memory high-water
# mark (what the engine reports, and what a limit is held against) then belongs to that job
# alone, and the page cache an earlier job brought in is not charged to the next.

QUICK_STEPS = 4
# The wide MLP (25.2M parameters, 101 MB): Adam's two moments are 202 MB per rank, large
# against torch's own few hundred MB, so what sharding saves shows in the process's memory.
# Adam's usual rate: SGD's 0.05 would throw the wide model's loss about.
TRAIN_DEFAULTS = TrainConfig(
    model="wide", steps=8, batch_size=64, lr=0.001, seed=0, collective_timeout_s=120.0
)


@dataclass(frozen=True)
class Config:
    """One way of running the job: its name (the job's directory), what the table calls it,
    and the ``TrainConfig`` fields it sets.

    The measured jobs run without the single-process reference: it starts every step from the
    whole optimizer state, gathered from the shards on rank 0 (torch's
    ``consolidate_state_dict`` even sends every shard to every rank: rank 1 peaked at 1789 MiB
    against DDP's 877 on 2 ranks), and it trains the global batch on rank 0 between steps,
    load the other jobs would not carry alike. That is memory, bytes and time of the check,
    not of the training; the measured jobs' parity is the replicas' bitwise identity after
    every step. The limited jobs run with the reference (:meth:`limited`): the sharded run
    that fits is judged against the single process, every step.
    """

    name: str
    label: str
    fields: tuple[tuple[str, Any], ...]

    def train(self, base: TrainConfig) -> TrainConfig:
        """The measured job's configuration."""
        return base.replace(**dict(self.fields), reference=False)

    def limited(self, base: TrainConfig) -> TrainConfig:
        """The job under the memory limit: the same, with the reference."""
        return base.replace(**dict(self.fields), reference=True)


DDP = Config("ddp-adam", "DDP + Adam", (("optimizer", "adam"),))
SHARDED = Config("sharded", "sharded (ours)", (("optimizer", "adam"), ("shard_optimizer", True)))
TORCH_ZERO = Config(
    "torch-zero",
    "torch DDP + ZeRO",
    (("optimizer", "adam"), ("shard_optimizer", True), ("wrapper", "torch")),
)
CONFIGS = (DDP, SHARDED, TORCH_ZERO)
# Under the memory limit: DDP with Adam (to be killed) and the sharded run (to fit).
LIMITED = {DDP.name: f"{DDP.name}-limited", SHARDED.name: f"{SHARDED.name}-limited"}


@dataclass(frozen=True)
class MemoryPlan:
    """What ``python -m lab memory`` runs, and its bounds."""

    nodes: int = 4
    warmup: int = 1
    train: TrainConfig = field(default_factory=lambda: TRAIN_DEFAULTS)
    limit: bool = True  # run the memory-limit jobs after the measured ones
    limit_mib: float | None = None  # the same limit on every node instead of the chosen ones
    run_timeout_s: float = 300.0  # wall time of one job
    image: str = DEFAULT_IMAGE
    runs_dir: Path = Path("runs")
    progress: bool = True

    def __post_init__(self) -> None:
        if self.nodes < 2:
            raise ValueError(f"--nodes must be >= 2 (sharding needs peers), got {self.nodes}")
        if self.limit_mib is not None:
            if not (math.isfinite(self.limit_mib) and self.limit_mib > 0):
                raise ValueError(f"--limit-mb must be a finite number > 0, got {self.limit_mib!r}")
            if not self.limit:
                raise ValueError("--limit-mb sets the limit of the runs --no-limit skips: drop one")
        check_warmup(self.warmup, self.train.steps)
        check_job(self.train, self.run_timeout_s, self.nodes, "job")
        for conf in CONFIGS:
            try:
                conf.train(self.train)
            except ValueError as e:
                raise ValueError(f"{conf.label}: {e}") from None

    @property
    def layout(self) -> Layout:
        return Layout(self.nodes, 1)

    @property
    def jobs(self) -> list[str]:
        """Every job, in run order."""
        return [c.name for c in CONFIGS] + (list(LIMITED.values()) if self.limit else [])

    def describe(self) -> str:
        t = self.train
        return (
            f"{self.nodes} nodes (one rank each), model {t.model}, Adam (lr {t.lr:g}), "
            f"{t.steps} steps, global batch {t.batch_size}"
        )


# ------------------------------------------------------------------------------------------
# The memory limit of the second part: per node, halfway from the sharded run's
# peak to DDP with Adam's, both as the engine measured them on that node; node 0 runs without
# one. Pure.
#
# Why not node 0: rank 0 also trains the single-process reference the parity verdict needs (its
# own model and Adam state), and before every step it gathers the whole optimizer state to start
# the reference from it, so it holds the whole state whether the run is sharded or not. Sharding
# saves nothing there by design of the check, not of the sharding; the other nodes are where the
# saving is, and where the limit is held.
#
# Why halfway: a peak holds page cache (what the ranks read: Python's files, the data), which
# the kernel evicts before it kills anyone once a limit is reached. Both runs hold about the
# same, C, so a run needs at least its peak minus C. And the limited runs train the parity
# reference, which the measured runs leave out (it would skew their bytes and times): every rank
# then also sends its part of the optimizer state to rank 0 before each step, a transient the
# measured sharded peak does not hold. Half the gap is room for that and for the run-to-run
# noise of the peaks, and leaves DDP half the gap short. A gap too small to split is refused:
# the model must grow, not the margin shrink.

REFERENCE_NODE = 0  # rank 0's node: it trains the parity reference too, and runs unlimited

MIN_GAP_MIB = 48.0  # below this the two runs' peaks are within the noise of one another
LIMIT_AT = 0.5  # the limit's place from the sharded run's peak (0) to DDP's (1)


def choose_limits(
    ddp: Mapping[int, float | None],
    sharded: Mapping[int, float | None],
    override_mib: float | None = None,
) -> dict[int, float]:
    """Node -> limit in MiB (whole MiB) for every node but the reference's: ``override_mib``,
    else ``LIMIT_AT`` of the way from the node's sharded peak to its DDP peak. ValueError
    when a peak is missing, or DDP's is not above the sharded run's by ``MIN_GAP_MIB`` on
    every such node."""
    if set(ddp) != set(sharded):
        raise ValueError(f"the runs had different nodes: {sorted(ddp)} vs {sorted(sharded)}")
    nodes = sorted(n for n in ddp if n != REFERENCE_NODE)
    if not nodes:
        raise ValueError("no node but the reference's to hold to a limit: give --nodes >= 2")
    if override_mib is not None:
        return {n: float(round(override_mib)) for n in nodes}
    limits = {}
    for node in nodes:
        a, b = ddp[node], sharded[node]
        if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
            raise ValueError(
                f"node{node}'s peak memory was not reported by the engine (cgroup v2?): give "
                "--limit-mb"
            )
        if a - b < MIN_GAP_MIB:
            raise ValueError(
                f"node{node}: DDP+Adam peaked at {a:.0f} MiB and the sharded run at {b:.0f} "
                f"MiB, less than {MIN_GAP_MIB:g} MiB apart: too close to pick a limit between "
                "them; use a larger model or more --nodes"
            )
        limits[node] = float(round(b + LIMIT_AT * (a - b)))
    return limits


def describe_limits(limits: Mapping[int, float]) -> str:
    """``"640 MiB"`` when every limited node has one limit, else ``"620-660 MiB"``."""
    low, high = min(limits.values()), max(limits.values())
    return f"{low:.0f} MiB" if round(low) == round(high) else f"{low:.0f}-{high:.0f} MiB"


# ------------------------------------------------------------------------------------------
# What a run of ``lab memory`` produced, as plain data: every job's exits, verdict, sampled
# eth0 counters and each node's memory as the engine reported it, and the limit chosen.
# Docker-free, so the report and its tests build on it without the engine.


@dataclass
class NodeMemory:
    """One node after a job: its container's peak (the cgroup's high-water mark; None when the
    engine did not report it), the limit it ran under (None: none) and how many out-of-memory
    kills the engine reported in it while the job ran."""

    peak_mib: float | None
    limit_mib: float | None = None
    oom_kills: int = 0


@dataclass
class JobRun:
    """One job: how its ranks exited, ddp's verdict, every node's eth0 samples (``"<time> <tx>
    <rx>"`` lines) and memory."""

    name: str
    codes: dict[int, int]
    parity: bool
    seconds: float
    counters: dict[int, str] = field(default_factory=dict)
    memory: dict[int, NodeMemory] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        """Every rank exited 0 and rank 0 said parity holds."""
        return self.parity and bool(self.codes) and all(c == 0 for c in self.codes.values())

    @property
    def oom_nodes(self) -> list[int]:
        return sorted(n for n, m in self.memory.items() if m.oom_kills)


@dataclass
class MemoryResult:
    plan: MemoryPlan
    run_id: str
    run_dir: Path
    jobs: dict[str, JobRun] = field(default_factory=dict)
    limits: dict[int, float] = field(default_factory=dict)  # node -> MiB, once chosen
    limit_error: str = ""  # why no limit could be chosen (the limited jobs did not run)
    seconds: float = 0.0

    def log_dir(self, job: str) -> Path:
        return self.run_dir / job / "logs"


# ------------------------------------------------------------------------------------------
# ``lab memory``'s run: each job in a fresh set of containers (so a container's memory
# high-water mark is that job's), followed through its records, every node's eth0 counters
# sampled while it runs (:mod:`lab.measure.counters`) and its memory read from the
# engine after (:mod:`lab.engine.memory`).
#
# First the three measured jobs, each of which must finish. Then, from their peaks, the limit
# (the limit section below), and the two limited jobs: DDP with Adam, which should be killed
# for memory, and the sharded run, which should finish with parity. Those two are followed to
# their end whatever it is, since a kill is an expected outcome; how they ended is the
# report's to judge.
# Every set of containers collects its logs into ``runs/<run-id>/<job>/`` and is removed on the
# way out, also on errors and Ctrl-C.

_SAMPLER_SLACK_S = 120.0  # the sampler outlives the job's timeout by this, then ends itself
_SLOW = "the wide model's steps take seconds on a loaded host"


def _job(
    plan: MemoryPlan,
    result: MemoryResult,
    name: str,
    cfg: TrainConfig,
    limits: dict[int, float] | None,
    echo: Callable[[str], None],
) -> JobRun:
    """One job in its own containers; with ``limits`` (node -> MiB) under a memory limit, and
    then not required to finish."""
    started = time.monotonic()
    cluster = Cluster(
        connect(),
        plan.layout,
        image=plan.image,
        run_id=result.run_id,
        run_dir=result.run_dir,
        lifetime_s=lifetime(1, plan.run_timeout_s),
        echo=echo,
    )
    with cluster:
        for node in cluster.nodes:
            if limits and node.index in limits:
                set_limit(node.container, limits[node.index])
        since = time.time()
        timeout_s = plan.run_timeout_s
        # Under a limit a rank killed for memory is an outcome: its peers get their
        # collective timeout to notice and say so (gloo may not see the peer go).
        grace = cfg.collective_timeout_s + FAIL_GRACE_S if limits else FAIL_GRACE_S
        with sampled(cluster, f"eth0-{name}", timeout_s + _SAMPLER_SLACK_S) as counters:
            job, running = train_followed(cluster, name, cfg, plan, echo=echo, fail_grace_s=grace)
        memory = {
            n.index: NodeMemory(
                peak_mib(n.container),
                (limits or {}).get(n.index),
                oom_kills(cluster.engines.client(n.index), n.container, since),
            )
            for n in cluster.nodes
        }
        if limits and running and not any(m.oom_kills for m in memory.values()):
            raise RunTimeout(
                f"{name}: ranks {running} still running after {timeout_s:g} s, and no rank was "
                f"killed for memory; raise --run-timeout ({_SLOW}), or look for a stuck rank"
            )
        if not limits:
            check_finished(
                job,
                running,
                where=name,
                output=result.run_dir / name,
                timeout_s=timeout_s,
                slow_hint=_SLOW,
            )
    return JobRun(
        name,
        dict(job.codes),
        holds(job),
        time.monotonic() - started,
        counters,
        memory,
    )


def _job_line(run: JobRun) -> str:
    peaks = ", ".join(
        f"node{n} {m.peak_mib:.0f}" if m.peak_mib is not None else f"node{n} ?"
        for n, m in sorted(run.memory.items())
    )
    if run.oom_nodes:
        end = f"killed for memory on {', '.join(f'node{n}' for n in run.oom_nodes)}"
    else:
        end = f"parity {'holds' if run.parity else 'BROKEN'}"
        if not run.finished:
            end += f", exits {run.codes}"
    return f"job {run.name}: {end}; peak MiB {peaks} ({run.seconds:.0f} s)"


def run(plan: MemoryPlan, echo: Callable[[str], None] = print) -> MemoryResult:
    """The three measured jobs, the limit chosen from them, the two limited jobs."""
    run_id = new_run_id()
    result = MemoryResult(plan, run_id, plan.runs_dir / run_id)
    echo(f"run {run_id}: {plan.describe()}; output in {result.run_dir}/")
    started = time.monotonic()
    try:
        for conf in CONFIGS:
            echo(f"job {conf.name}: {conf.label}")
            result.jobs[conf.name] = _job(
                plan, result, conf.name, conf.train(plan.train), None, echo
            )
            echo(_job_line(result.jobs[conf.name]))
        if not plan.limit:
            return result
        peaks = {
            c.name: {n: m.peak_mib for n, m in result.jobs[c.name].memory.items()}
            for c in (DDP, SHARDED)
        }
        try:
            result.limits = choose_limits(peaks[DDP.name], peaks[SHARDED.name], plan.limit_mib)
        except ValueError as e:
            result.limit_error = str(e)
            echo(f"no memory limit: {e}")
            return result
        held = ", ".join(f"node{n} {v:.0f}" for n, v in sorted(result.limits.items()))
        echo(f"memory limit (MiB): {held}; node{REFERENCE_NODE} (the parity reference) unlimited")
        for conf in (DDP, SHARDED):
            name = LIMITED[conf.name]
            echo(f"job {name}: {conf.label} under the limit, parity against the reference")
            cfg = conf.limited(plan.train)
            result.jobs[name] = _job(plan, result, name, cfg, result.limits, echo)
            echo(_job_line(result.jobs[name]))
        return result
    finally:
        result.seconds = time.monotonic() - started


# ------------------------------------------------------------------------------------------
# Per rank what each way of running the job held and moved, from the step records, the sampled
# eth0 counters and the engine's memory figures; and how the limited jobs ended. :func:`analyse`
# turns a run's result into the one :class:`MemorySummary` the files, the console text and the
# page are built from. Pure but for reading the collected logs.
#
# What is compared, DDP with Adam being 1.00x:
#
# - optimizer state: the bytes of the optimizer's tensors on the rank that holds the most (a
#   partition by whole parameters, as torch's ``ZeroRedundancyOptimizer`` makes, is uneven);
# - link bytes: what every node's eth0 sent during the measured steps, summed, per step. Each
#   step's window runs from its first rank's start to its last rank's end, so what the parity
#   check moves between steps (the whole optimizer state, gathered on rank 0 to start the
#   reference from) is left out: it is the check's, not the training's;
# - step time: per step the slowest rank's ``step_ms`` (everyone waits for it), median.

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
    by_step = measured_steps(logs, warmup, where)
    steps = list(by_step)
    measured = {k: [r for r in log.steps if r.step in by_step] for k, log in logs.items()}
    spans = []
    for recs in by_step.values():
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
    job_step = statistics.median(slowest_ms(by_step))
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


# ------------------------------------------------------------------------------------------
# What ``lab memory`` prints, from the run's summary: the per-rank table of the three jobs,
# what happened under the memory limit, and the closing line for scripts. Pure.

HEADERS = (
    "job",
    "rank",
    "peak RSS MiB",
    "node peak MiB",
    "optimizer state MB",
    "link MB/step",
    "step ms",
)


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


_WIDTHS = (18, 6, 14, 15, 20, 14, 10)


def _line(cells: list[str] | tuple[str, ...]) -> str:
    return "".join(
        f"{c:<{w}}" if i == 0 else f"{c:>{w}}"
        for i, (c, w) in enumerate(zip(cells, _WIDTHS, strict=True))
    )


def format_table(s: MemorySummary) -> str:
    """Per job and rank: memory, optimizer state, link bytes and step time; per job a total
    line (the link summed over the nodes, the step the slowest rank's)."""
    lines = [_line(HEADERS)]
    for job in s.jobs.values():
        for r in job.rows:
            lines.append(
                _line(
                    [
                        job.label,
                        str(r.rank),
                        _f(r.peak_rss_mib, 0),
                        _f(r.node_peak_mib, 0),
                        _f(r.optimizer_state_mb),
                        _f(r.link_mb_per_step),
                        _f(r.step_ms),
                    ]
                )
            )
        lines.append(_line(["", "job", "", "", "", _f(job.link_mb_per_step), _f(job.job_step_ms)]))
    return "\n".join(lines)


def headline_line(s: MemorySummary) -> str:
    """The closing line, e.g. ``sharded optimizer at 4 ranks: optimizer state 0.25x per rank,
    link bytes 1.00x DDP (torch ZeRO: 1.50x), step time 1.02x DDP (torch ZeRO: 1.10x); fits in
    640 MiB where DDP+Adam was killed``."""
    x, plan = s.ratios, s.result.plan
    line = (
        f"sharded optimizer at {plan.nodes} ranks: optimizer state {x.state_x:.2f}x per rank "
        f"(torch ZeRO: {x.torch_state_x:.2f}x), link bytes {x.link_x:.2f}x DDP (torch ZeRO: "
        f"{x.torch_link_x:.2f}x), step time {x.step_x:.2f}x DDP (torch ZeRO: "
        f"{x.torch_step_x:.2f}x)"
    )
    lim = s.limit
    if not plan.limit:
        return line + "; no memory-limit run (--no-limit)"
    if lim is None:
        return line + "; no memory-limit run"
    where = describe_limits(lim.limits)
    if lim.held:
        return line + f"; fits in {where} where DDP+Adam was killed"
    ddp = "DDP+Adam was killed" if lim.ddp_killed else "DDP+Adam was NOT killed"
    ours = "the sharded run fits" if lim.sharded_fits else "the sharded run did NOT fit"
    return line + f"; under {where}: {ddp}, {ours}"


def closing(s: MemorySummary) -> Closing:
    """The table and the limit's lines, then (after the 'took' line and what broke) the
    headline."""
    plan = s.result.plan
    table = [f"{plan.describe()}; medians over the measured steps:", format_table(s)]
    if s.limit is not None:
        table += s.limit.lines()
    elif s.result.limit_error:
        table.append(f"no memory limit: {s.result.limit_error}")
    return Closing(table, [headline_line(s)])


# ------------------------------------------------------------------------------------------
# What ``lab memory`` writes to ``runs/<run-id>/``: ``memory.csv`` (one row per job and rank),
# ``memory.txt`` (the table and the limit's lines, as printed) and ``memory.json`` (settings,
# definitions, every figure, the limit and how each limited job ended). From the run's summary.


def _num(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, 3)


def _row(r: RankRow) -> dict[str, object]:
    return {
        "job": r.job,
        "rank": r.rank,
        "peak_rss_mib": _num(r.peak_rss_mib),
        "node_peak_mib": _num(r.node_peak_mib),
        "optimizer_state_mb": _num(r.optimizer_state_mb),
        "link_mb_per_step": _num(r.link_mb_per_step),
        "step_ms": _num(r.step_ms),
    }


def _limited(run: JobRun) -> dict[str, object]:
    return {
        "codes": {str(k): c for k, c in run.codes.items()},
        "parity": run.parity,
        "finished": run.finished,
        "oom_nodes": run.oom_nodes,
        "memory": {str(n): dataclasses.asdict(m) for n, m in run.memory.items()},
        "seconds": round(run.seconds, 1),
    }


def write_files(s: MemorySummary) -> list[Path]:
    """Every file of the run; the paths written."""
    result, plan = s.result, s.result.plan
    run_dir = result.run_dir
    rows = [_row(r) for job in s.jobs.values() for r in job.rows]
    files = [run_dir / "memory.csv"]
    with open(files[0], "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    text = [format_table(s)]
    if s.limit is not None:
        text += s.limit.lines()
    text.append(headline_line(s))
    files.append(run_dir / "memory.txt")
    files[-1].write_text("\n".join(text) + "\n")
    files.append(run_dir / "memory.json")
    settings = {
        f.name: str(v) if isinstance(v := getattr(plan, f.name), Path) else v
        for f in dataclasses.fields(plan)
        if f.name != "train"
    }
    settings["train"] = plan.train.to_dict()
    lim = s.limit
    doc = {
        "run_id": result.run_id,
        "settings": settings,
        "definitions": DEFINITIONS,
        "rows": rows,
        "jobs": {
            n: {
                "job_step_ms": _num(j.job_step_ms),
                "link_mb_per_step": _num(j.link_mb_per_step),
                "optimizer_state_mb_max": _num(j.state_mb),
                "steps_measured": j.steps_measured,
                "parity": j.parity,
            }
            for n, j in s.jobs.items()
        },
        "ratios": {k: _num(v) for k, v in dataclasses.asdict(s.ratios).items()},
        "limit": None
        if lim is None
        else {
            "mib": {str(n): v for n, v in lim.limits.items()},
            "ddp_killed": lim.ddp_killed,
            "sharded_fits": lim.sharded_fits,
            "ddp": _limited(lim.ddp),
            "sharded": _limited(lim.sharded),
        },
        "limit_error": result.limit_error,
        "headline": headline_line(s),
        "seconds": round(result.seconds, 1),
        "files": [f.name for f in files],
    }
    files[-1].write_text(json.dumps(doc, indent=2) + "\n")
    return files


# ------------------------------------------------------------------------------------------
# ``lab memory``'s page: the headline (what sharding saves, what it moves, what it costs, and
# the limit DDP with Adam dies under while the sharded run fits), the per-rank table, the limited
# jobs' outcome and every rank's exit. From the run's summary.

_FILES = [
    ("memory.csv", "the per-rank table"),
    ("memory.txt", "the table and the limit's outcome, as printed"),
    ("memory.json", "settings, definitions, every figure, the limit"),
]


def _cell(v: float | None) -> object:
    return "" if v is None or not math.isfinite(v) else round(v, 1)


def page(summary: MemorySummary) -> Results:
    """The page and the run's summary.json fields."""
    result, plan = summary.result, summary.result.plan
    rows = []
    for job in summary.jobs.values():
        for r in job.rows:
            rows.append(
                [
                    job.label,
                    r.rank,
                    _cell(r.peak_rss_mib),
                    _cell(r.node_peak_mib),
                    _cell(r.optimizer_state_mb),
                    _cell(r.link_mb_per_step),
                    _cell(r.step_ms),
                ]
            )
        rows.append(
            [job.label, "job", "", "", "", _cell(job.link_mb_per_step), _cell(job.job_step_ms)]
        )
    limit = (
        summary.limit.lines()
        if summary.limit is not None
        else [result.limit_error or "no memory-limit run (--no-limit)"]
    )
    sections = [
        Section(
            "Per rank: memory, optimizer state, link bytes, step time",
            [
                Table(HEADERS, rows, f"{plan.describe()}; medians over the measured steps"),
                Text([headline_line(summary)]),
            ],
        ),
        Section("Under a memory limit", [Text(limit, pre=True)]),
    ]
    x = summary.ratios
    figure = (
        f"optimizer state {x.state_x:.2f}x per rank, link bytes {x.link_x:.2f}x DDP "
        f"at {plan.nodes} ranks"
    )
    held = "parity holds; DDP+Adam killed for memory where the sharded run fits"
    if not plan.limit:
        held = "parity holds in every job"
    headline = (summary.broken, held, figure)
    configs = {n: j.job_step_ms for n, j in summary.jobs.items()}
    ranks = {n: j.codes for n, j in result.jobs.items()}
    return sweep_results("memory", result, sections, ranks, headline, configs, _FILES)


# ------------------------------------------------------------------------------------------
# The command: its flags, the plan from them, the report.

NAME = "memory"
HELP = "shard Adam's state (ZeRO-1): its memory per rank, its link bytes, the limit it fits in"
DESCRIPTION = textwrap.fill(
    "The same job three ways, each in fresh containers with one rank each: our DDP with Adam, "
    "ours with the optimizer state sharded, and torch's DDP with torch's "
    "ZeroRedundancyOptimizer. Adam keeps two tensors per parameter, twice the model, and with "
    "DDP every rank keeps all of them; sharded, each rank keeps its 1/N, while the gradients' "
    "reduce-scatter and the parameters' all-gather move what one allreduce moves. Then under a "
    "container memory limit chosen between the two runs' peaks: DDP with Adam is killed for "
    "memory, the sharded run finishes with parity.",
    width=92,
)
EPILOG = "\n".join(
    [
        "The table gives, per job and rank:",
        *common.definitions(DEFINITIONS),
        "The memory limit is chosen per node, halfway from the sharded run's",
        "peak to DDP's on that node, no swap; --limit-mb sets one limit instead. Node 0 runs",
        "unlimited: it also trains the parity reference and gathers the whole optimizer state",
        "for it before every step, so it holds the whole state sharded or not.",
        "The closing line is",
        "  sharded optimizer at N ranks: optimizer state X.XXx per rank (torch ZeRO: ...), link",
        "  bytes X.XXx DDP (torch ZeRO: ...), step time X.XXx DDP (torch ZeRO: ...); fits in",
        "  M MiB where DDP+Adam was killed",
        "Files in runs/<run-id>/: memory.csv, memory.txt, memory.json, report.html and one",
        "folder per job with logs/rank<R>.jsonl and node<N>.log.",
        "Exit codes: 0 parity held everywhere, DDP+Adam was killed for memory under the limit",
        "and the sharded run fit; 1 otherwise; 2 bad arguments; 130 interrupted.",
    ]
)

_TRAIN_FIELDS = ["model", "steps", "batch_size", "lr", "seed", "bucket_cap_mb"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_nodes(p, 4)
    common.add_warmup(p, 1)
    p.add_argument(
        "--limit-mb",
        type=common.number(0, strict=True),
        metavar="MB",
        help="one memory limit (MiB) on every node for the limited jobs, instead of the one "
        "chosen from the measured peaks",
    )
    p.add_argument(
        "--no-limit",
        dest="limit",
        action="store_false",
        help="measure only: skip the jobs under a memory limit",
    )
    p.add_argument(
        "--quick", action="store_true", help=f"{QUICK_STEPS} steps per job: a few minutes"
    )
    common.add_job_flags(p, _TRAIN_FIELDS, TRAIN_DEFAULTS, "one job")


def plan(args: argparse.Namespace) -> MemoryPlan:
    train = config_from_args(args, [*_TRAIN_FIELDS, "collective_timeout_s"], TRAIN_DEFAULTS)
    if args.quick:
        train = train.replace(steps=QUICK_STEPS)
    return MemoryPlan(
        nodes=args.nodes,
        warmup=args.warmup,
        train=train,
        limit=args.limit,
        limit_mib=args.limit_mb,
        **common.run_fields(args),
    )


def report(result: MemoryResult) -> int:
    """Exit 0 when parity held everywhere and the limit killed DDP+Adam but not the sharded
    run, else 1."""
    return report_sweep(result, analyse, files=write_files, console=closing, page=page, name=NAME)
