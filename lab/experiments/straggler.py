"""``python -m lab straggler``: one slow rank makes every rank slow, because the gradient
allreduce is a barrier.

One cluster runs the same training twice: an unslowed baseline, then with one rank's container
under a real CPU quota (and/or a slower link into it). Every rank's step time rises to the
straggler's: the fast ranks finish their backward early and then wait in the allreduce, which
cannot complete before the slowest rank's gradients arrive. The report splits each rank's step
into compute and waiting, beside the baseline, and draws one step of each job as a Gantt chart.

One module, read top to bottom in the order data flows: the plan (pure, validated), the
result, the slow link and the run on the engine, the analysis (pure but for reading the
collected logs: one summary object), then the table (declared once, rendered to the console,
the page and the files), what is printed, the files and the page, each from that summary
alone; last the command's flags and :func:`report`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import textwrap
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ddp.torchfree import (
    RankLog,
    Section,
    StepRecord,
    Text,
    TrainConfig,
    config_from_args,
    load_run,
)
from lab import args as common
from lab.args import check_job, check_warmup
from lab.engine.cluster import Cluster
from lab.engine.layout import Layout
from lab.engine.specs import DEFAULT_IMAGE
from lab.experiments import timeline
from lab.experiments.followed import holds, train_to_end
from lab.experiments.sweep import lifetime, sweep_cluster
from lab.measure.windows import measured_steps, slowest_ms
from lab.report.common import figures_section
from lab.report.report import Closing, plan_settings
from lab.report.report import report as report_sweep
from lab.report.results import Results, sweep_results
from lab.report.table import Column, Table
from lab.shaping.impair import Impairments
from lab.shaping.verified_link import verified_link

__all__ = [
    "BASELINE_JOB",
    "COLUMNS",
    "CPU_PERIOD_US",
    "DEFINITIONS",
    "QUICK_STEPS",
    "SLOWED_JOB",
    "TRAIN_DEFAULTS",
    "Figures",
    "JobRun",
    "JobStats",
    "RankRow",
    "StragglerPlan",
    "StragglerResult",
    "StragglerSummary",
    "add_arguments",
    "analyse",
    "closing",
    "fair_share",
    "format_table",
    "headline_line",
    "job_stats",
    "page",
    "plan",
    "report",
    "run",
    "slow_link",
    "summarize",
    "table",
    "write_files",
]

# The plan: which rank is slowed, by how much CPU, and the training both jobs run (an
# unslowed baseline, then the same job with the straggler), validated before any container
# exists. Pure: tested without Docker.
#
# The slowdown is a real CPU quota on the straggler's container (cgroup CFS bandwidth), not a
# sleep. ``--slowdown X`` asks for X times less CPU than the rank's fair share of the host
# (host cores / nodes): four ranks on a 2-core host get 0.5 core each, so ``--slowdown 4`` is
# a quota of 0.125 cores. A quota at or above the fair share slows nothing, which is why it is
# derived from the share and not given as a bare number (``--cpus`` overrides it, for
# measuring what quota gives what slowdown). The slowdown the ranks really see is measured,
# and reported beside the one asked.

BASELINE_JOB, SLOWED_JOB = "baseline", "straggler"
QUICK_STEPS = 8
# The deep MLP (12 x 256 hidden) at 256 samples per rank: forward+backward is tens of ms of
# real CPU work per step, large against one allreduce on the bridge, so a slowed rank shows.
TRAIN_DEFAULTS = TrainConfig(
    model="deep", steps=30, batch_size=1024, seed=0, collective_timeout_s=60.0
)
# The quota's CFS period: the kernel lets the container run `quota` cores x period, then
# throttles it until the period ends. With docker's 100 ms a step of a few tens of ms runs at
# full speed or stalls whole; 10 ms spreads the slowdown over every step.
CPU_PERIOD_US = 10_000
_MIN_CPUS = 0.01  # the kernel's smallest CFS quota is 1 ms per period; 1% of a core is safer


def fair_share(host_cpus: int, nodes: int) -> float:
    """Cores per node when every node's ranks are busy: what an unslowed rank gets."""
    return host_cpus / nodes


@dataclass(frozen=True)
class StragglerPlan:
    """What ``python -m lab straggler`` runs, and its bounds."""

    rank: int = 1
    slowdown: float = 4.0  # asked: X times less CPU than the fair share
    cpus: float | None = None  # explicit quota in cores (overrides --slowdown)
    slow_link_ms: float = 0.0  # extra one-way delay on the straggler's node only
    shaper: str = "auto"
    nodes: int = 4
    warmup: int = 2
    train: TrainConfig = field(default_factory=lambda: TRAIN_DEFAULTS)
    run_timeout_s: float = 300.0  # wall time of one job
    host_cpus: int = field(default_factory=lambda: os.cpu_count() or 1)
    image: str = DEFAULT_IMAGE
    runs_dir: Path = Path("runs")
    progress: bool = True
    impair: Impairments = field(default_factory=Impairments)  # with the slow link only

    def __post_init__(self) -> None:
        if self.impair and not self.slow_link_ms:
            raise ValueError(
                "--jitter-ms and --loss-pct impair the slowed job's link: give --slow-link-ms "
                "too (e.g. --slow-link-ms 10), or use `lab latency` for impairments alone"
            )
        if self.nodes < 2:
            raise ValueError(f"--nodes must be >= 2 (a straggler needs peers), got {self.nodes}")
        if not 0 <= self.rank < self.nodes:
            raise ValueError(
                f"--rank must be in 0..{self.nodes - 1} (one rank per node), got {self.rank}"
            )
        if not (math.isfinite(self.slowdown) and self.slowdown >= 1):
            raise ValueError(
                f"--slowdown must be a finite number >= 1 (1 = no quota), got {self.slowdown!r}"
            )
        if self.cpus is not None and not (
            math.isfinite(self.cpus) and _MIN_CPUS <= self.cpus <= self.host_cpus
        ):
            raise ValueError(
                f"--cpus must be between {_MIN_CPUS:g} and the host's {self.host_cpus} cores, "
                f"got {self.cpus!r}"
            )
        if not (math.isfinite(self.slow_link_ms) and self.slow_link_ms >= 0):
            raise ValueError(
                f"--slow-link-ms must be a finite number >= 0, got {self.slow_link_ms!r}"
            )
        if self.quota is None and not self.slow_link_ms:
            raise ValueError(
                "nothing slows the straggler: give --slowdown above 1, --cpus, or --slow-link-ms"
            )
        check_warmup(self.warmup, self.train.steps)
        check_job(self.train, self.run_timeout_s, self.nodes, "job")

    @property
    def layout(self) -> Layout:
        return Layout(self.nodes, 1)

    @property
    def node(self) -> int:
        """The straggler's container (one rank per node)."""
        return self.layout.node_of(self.rank)

    @property
    def share(self) -> float:
        return fair_share(self.host_cpus, self.nodes)

    @property
    def quota(self) -> float | None:
        """The straggler's CPU quota in cores, None when only its link is slowed."""
        if self.cpus is not None:
            return self.cpus
        if self.slowdown == 1:
            return None
        return max(_MIN_CPUS, self.share / self.slowdown)

    def describe(self) -> str:
        """What slows the straggler, in one phrase."""
        parts = []
        if self.quota is not None:
            asked = "--cpus" if self.cpus is not None else f"--slowdown {self.slowdown:g}"
            parts.append(
                f"a CPU quota of {self.quota:.3g} cores ({asked}; fair share "
                f"{self.share:.3g} = {self.host_cpus} cores / {self.nodes} nodes)"
            )
        if self.slow_link_ms:
            impair = f" (every link: {self.impair.describe()})" if self.impair else ""
            parts.append(f"{self.slow_link_ms:g} ms extra one-way delay on its link{impair}")
        return f"rank {self.rank} (node{self.node}) slowed by " + " and ".join(parts)


# What a run produced, as plain data: both jobs and the slow link's probe line. Docker-free,
# so the report and its tests build on it without the engine.


@dataclass
class JobRun:
    name: str
    codes: dict[int, int]
    parity: bool
    seconds: float


@dataclass
class StragglerResult:
    plan: StragglerPlan
    run_id: str
    run_dir: Path
    jobs: dict[str, JobRun] = field(default_factory=dict)
    link_lines: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def log_dir(self, job: str) -> Path:
        return self.run_dir / job / "logs"


# The straggler's slow link: every packet into (netem: out of) the straggler's node delayed
# by --slow-link-ms, the other nodes' links untouched, verified by the probe from the
# straggler to a peer (lab.shaping.link.shaped with per-node delays) for as long as the
# slowed job runs (lab.shaping.verified_link.verified_link).


@contextlib.contextmanager
def slow_link(cluster: Cluster, plan: StragglerPlan, max_seconds: float) -> Iterator[str]:
    """Shape the straggler's link, yield the probe's line (asked vs measured), undo."""
    with verified_link(
        cluster,
        "for the slow link",
        0.0,
        plan.shaper,
        node_ms={plan.node: plan.slow_link_ms},
        max_seconds=max_seconds,
        impair=plan.impair,
    ) as rep:
        yield (f"{rep.note}\n" if rep.note else "") + rep.line()


# The run: one cluster, an unslowed baseline job, then the same job with the straggler slowed
# (a CPU quota on its container, and/or a slower link into it). Both jobs run in the same
# containers, one after the other, so the only difference between them is the slowdown. Each
# is followed through its records (progress from rank 0's steps, success from exits and the
# verdict); on the way out, also on errors and Ctrl-C, the cluster collects the logs into
# runs/<run-id>/<job>/ and removes everything it made.


def _run_job(cluster: Cluster, plan: StragglerPlan, name: str, echo: Callable) -> JobRun:
    started = time.monotonic()
    slow = "a straggler with a tiny quota is slow"
    job = train_to_end(
        cluster, name, plan.train, plan, where=f"job {name}", slow_hint=slow, echo=echo
    )
    return JobRun(name, dict(job.codes), holds(job), time.monotonic() - started)


@contextlib.contextmanager
def _slowed(
    cluster: Cluster, plan: StragglerPlan, lifetime_s: float, echo, links: list[str]
) -> Iterator[None]:
    """The straggler's slowdown, applied for the slowed job and lifted after it; the verified
    link's line goes to ``links``."""
    with contextlib.ExitStack() as undo:
        if plan.quota is not None:
            cluster.set_cpus(plan.node, plan.quota, CPU_PERIOD_US)
            undo.callback(_lift_quota, cluster, plan.node, echo)
            echo(
                f"node{plan.node}: CPU quota {plan.quota:.3g} cores "
                f"({plan.quota * CPU_PERIOD_US / 1e3:.2f} ms per {CPU_PERIOD_US / 1e3:g} ms)"
            )
        if plan.slow_link_ms:
            links.append(undo.enter_context(slow_link(cluster, plan, lifetime_s)))
            echo(links[-1])
        yield


def _lift_quota(cluster: Cluster, node: int, echo: Callable[[str], None]) -> None:
    # Best effort: the containers are removed right after, and an error here must not hide
    # the one that ended the job (e.g. Ctrl-C).
    try:
        cluster.set_cpus(node, None, CPU_PERIOD_US)
    except Exception as e:
        echo(f"warning: could not lift node{node}'s CPU quota (removed with the run): {e}")


def _header(result: StragglerResult) -> str:
    plan = result.plan
    return (
        f"run {result.run_id}: {plan.nodes} nodes, model {plan.train.model}, "
        f"{plan.train.steps} steps, batch {plan.train.batch_size}; {plan.describe()}; "
        f"output in {result.run_dir}/"
    )


def run(plan: StragglerPlan, echo: Callable[[str], None] = print) -> StragglerResult:
    """Baseline, then the straggler, in one cluster that is always cleaned up."""
    lifetime_s = lifetime(2, plan.run_timeout_s)
    with sweep_cluster(
        plan,
        StragglerResult,
        _header,
        echo,
        lifetime_s=lifetime_s,
        net_admin=bool(plan.slow_link_ms),
    ) as (cluster, result):
        for name in (BASELINE_JOB, SLOWED_JOB):
            echo(f"job {name}: {'unslowed' if name == BASELINE_JOB else plan.describe()}")
            with contextlib.ExitStack() as stack:
                if name == SLOWED_JOB:
                    stack.enter_context(_slowed(cluster, plan, lifetime_s, echo, result.link_lines))
                job = _run_job(cluster, plan, name, echo)
            result.jobs[name] = job
            echo(
                f"job {name}: done in {job.seconds:.0f} s, parity "
                f"{'holds' if job.parity else 'BROKEN'}"
            )
    return result


# The analysis: per rank compute vs waiting, from the step records of the baseline and the
# slowed job. Pure but for reading the collected logs.
#
# A step record's step_ms is the rank's whole step (forward, backward, optimizer) and comm_ms
# the time it then waited for the gradient allreduces to finish. The allreduce completes only
# once *every* rank contributed its gradients, so that wait is time the rank spent waiting
# for the slowest peer (plus the transfer itself): waiting = comm_ms and compute = step_ms -
# comm_ms. A fast rank's step therefore grows to the straggler's step, the difference showing
# up as waiting; the straggler itself waits for nobody.

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

    @property
    def label(self) -> int | str:
        """The rank as people read it: the straggler marked."""
        return f"{self.rank} (slow)" if self.straggler else self.rank


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


# The table: per rank, the slowed job beside the unslowed baseline (medians, ms), declared
# once; the console, the page, straggler.csv and straggler.json's rows are renderings of it.
# Below the ranks, the job-wide step (the slowest rank's, which everyone waits for).


@dataclass(frozen=True)
class _JobStep:
    """The table's last line: the job's step, slowed vs unslowed; no per-rank split."""

    step_ms: float
    baseline_step_ms: float
    vs_baseline: float
    label: str = "job step"
    compute_ms: None = None
    waiting_ms: None = None
    baseline_compute_ms: None = None
    baseline_waiting_ms: None = None


_PEOPLE = frozenset({"console", "page"})
_FILES_ONLY = frozenset({"files"})

COLUMNS: list[Column] = [
    Column("label", "rank", lambda r: r.label, width=12, align="<", places=_PEOPLE),
    Column("rank", "rank", lambda r: r.rank, places=_FILES_ONLY),
    Column("straggler", "straggler", lambda r: r.straggler, places=_FILES_ONLY),
    Column("compute_ms", "compute", lambda r: r.compute_ms, unit="ms"),
    Column("waiting_ms", "waiting", lambda r: r.waiting_ms, unit="ms"),
    Column("step_ms", "step", lambda r: r.step_ms, unit="ms", width=10),
    Column("baseline_step_ms", "baseline step", lambda r: r.baseline_step_ms, unit="ms", width=18),
    Column("vs_baseline", "vs baseline", lambda r: r.vs_baseline, fmt=".2f", suffix="x", width=13),
    Column(
        "baseline_compute_ms",
        "baseline compute",
        lambda r: r.baseline_compute_ms,
        unit="ms",
        width=21,
    ),
    Column(
        "baseline_waiting_ms",
        "baseline waiting",
        lambda r: r.baseline_waiting_ms,
        unit="ms",
        places=frozenset({"page", "files"}),
    ),
]


def table(s: Figures, caption: str = "") -> Table:
    """The per-rank table of ``s``, the job's step below the ranks."""
    job = _JobStep(s.job_step_ms, s.baseline_job_step_ms, s.job_x)
    return Table(COLUMNS, s.rows, footer=[job], caption=caption)


# What is printed: the table, then (after the 'took' line and what broke) the closing line.


def format_table(s: Figures) -> str:
    """Per rank, slowed job beside the unslowed baseline (medians, ms)."""
    return table(s).console()


def headline_line(s: Figures, straggler: int, cpu: bool = True) -> str:
    """The closing line. ``cpu``: the straggler was slowed by a CPU quota (its compute is what
    changed); else only by its link (what changed is everyone's waiting)."""
    what = f"its compute {s.straggler_compute_x:.1f}x slower" if cpu else "its link slower"
    return (
        f"straggler rank {straggler}: {what}, every rank's step {s.job_x:.1f}x "
        f"({s.baseline_job_step_ms:.1f} -> {s.job_step_ms:.1f} ms); "
        f"the others wait {s.others_waiting_ms:.1f} ms per step in allreduce"
    )


def _headline(summary: StragglerSummary) -> str:
    plan = summary.result.plan
    return headline_line(summary.figures, plan.rank, cpu=plan.quota is not None)


def closing(summary: StragglerSummary) -> Closing:
    """The table, then (after the 'took' line and what broke) the headline."""
    plan = summary.result.plan
    return Closing(
        [f"{plan.describe()}; medians over the measured steps:", format_table(summary.figures)],
        [_headline(summary)],
    )


# The files in runs/<run-id>/: straggler.csv, straggler.json, trace.json (Chrome trace) and
# gantt.png (one representative step, unslowed above, slowed below: the fast ranks' yellow
# "allreduce wait" bar is the time they spend waiting for the straggler).


def write_files(s: StragglerSummary) -> list[Path]:
    """Every file of the run; the paths written."""
    result, figures = s.result, s.figures
    plan, run_dir = result.plan, result.run_dir
    rows = table(figures)
    files = [rows.write_csv(run_dir / "straggler.csv")]
    files.append(run_dir / "trace.json")
    files[-1].write_text(json.dumps(timeline.chrome_trace(s.traced)))
    files.append(run_dir / "gantt.png")
    timeline.write_gantt(
        files[-1],
        s.traced,
        suptitle=f"one step, {plan.nodes} ranks: yellow after backward = waiting for the slowest",
    )
    files.append(run_dir / "straggler.json")
    doc = {
        "run_id": result.run_id,
        "settings": plan_settings(plan, skip=("train",), quota_cpus=plan.quota, train=plan.train),
        "definitions": DEFINITIONS,
        "rows": rows.records(),
        "job_step_ms": figures.job_step_ms,
        "baseline_job_step_ms": figures.baseline_job_step_ms,
        "job_step_x": figures.job_x,
        "straggler_compute_x": figures.straggler_compute_x,
        "others_waiting_ms": figures.others_waiting_ms,
        "links": result.link_lines,
        "timeline_steps": s.steps,
        "jobs": {n: asdict(j) for n, j in result.jobs.items()},
        "seconds": round(result.seconds, 1),
        "files": [f.name for f in files],
    }
    files[-1].write_text(json.dumps(doc, indent=2) + "\n")
    return files


# The page: how much one slow rank slows every rank as the headline, the per-rank split of
# each step into compute and waiting beside the baseline, the Gantt chart, the slow link's
# probe and every rank's exit.

_FILES = [
    ("straggler.csv", "the per-rank table"),
    ("straggler.json", "settings, definitions, every figure"),
    ("trace.json", "Chrome trace of one step of each job"),
]


def page(summary: StragglerSummary) -> Results:
    """The page and the run's summary.json fields."""
    result, s = summary.result, summary.figures
    plan = result.plan
    jobs = [BASELINE_JOB, SLOWED_JOB]
    caption = f"{plan.describe()}; medians over the measured steps"
    sections = [
        Section(
            "Per rank, slowed vs the unslowed baseline",
            [table(s, caption).page(), Text([_headline(summary)])],
        ),
        figures_section(
            result.run_dir,
            [
                (
                    "gantt.png",
                    "one step: unslowed above, slowed below; yellow after backward = waiting",
                )
            ],
        ),
        Section(
            "The slow link, as the probe measured it",
            [Text(result.link_lines or ["no link was shaped"], pre=True)],
        ),
    ]
    figure = f"every rank's step {s.job_x:.1f}x with rank {plan.rank} slowed"
    headline = (summary.broken, "parity holds in both jobs", figure)
    configs = {"baseline": s.baseline_job_step_ms, "slowed": s.job_step_ms}
    ranks = {j: result.jobs[j].codes for j in jobs if j in result.jobs}
    return sweep_results("straggler", result, sections, ranks, headline, configs, _FILES, jobs)


# The command: its flags, the plan from them, and the report.

NAME = "straggler"
HELP = "slow one rank (a CPU quota, or a slow link): every rank's step rises to its step"
DESCRIPTION = textwrap.fill(
    "An unslowed baseline, then the same training with one rank's container under a real CPU "
    "quota (cgroup CFS, not a sleep) and/or a slower link into it. Why every rank slows down: "
    "the gradient allreduce is a barrier. A fast rank launches its buckets' allreduces during "
    "backward, but none of them can complete before the straggler has contributed its "
    "gradients, so the fast rank finishes its backward and then waits; every step takes as "
    "long as the slowest rank's. DDP cannot hide a straggler; only balancing the work can.",
    width=92,
)
EPILOG = "\n".join(
    [
        "The table gives, per rank, medians over the measured steps:",
        *common.definitions(DEFINITIONS),
        "The closing line is",
        "  straggler rank R: its compute X.Xx slower, every rank's step Y.Yx (A -> B ms); the",
        "  others wait W ms per step in allreduce",
        "('its link slower' instead of the compute figure when only --slow-link-ms is given).",
        "--slowdown X gives the straggler X times less CPU than its fair share (host cores /",
        "nodes; 0.5 core for 4 nodes on 2 cores): a quota above the share slows nothing. The",
        "measured compute slowdown is printed beside it (a loaded host gives less than asked).",
        "Files in runs/<run-id>/: straggler.csv, straggler.json, trace.json (Chrome trace:",
        "https://ui.perfetto.dev), gantt.png (one step unslowed above, slowed below), and",
        "baseline/ and straggler/ with logs/rank<R>.jsonl and node<N>.log.",
        "Exit codes: 0 both jobs finished with parity, 1 a job failed or parity broke, 2 bad",
        "arguments, 130 interrupted.",
    ]
)

_TRAIN_FIELDS = ["model", "steps", "batch_size", "seed", "bucket_cap_mb"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rank", type=common.number(0, kind=int), default=1, help="the straggler (default 1)"
    )
    p.add_argument(
        "--slowdown",
        type=common.number(1),
        metavar="X",
        help="CPU quota = fair share / X on the straggler's container (default 4, or 1 = no "
        "quota when --slow-link-ms is given)",
    )
    common.add_cpus(p, "the straggler's CPU quota in cores, instead of --slowdown")
    p.add_argument(
        "--slow-link-ms",
        type=common.number(0),
        default=0.0,
        metavar="MS",
        help="extra one-way delay on every packet into the straggler's node only (default 0)",
    )
    common.add_shaper(p, "for --slow-link-ms: netem, or the nfqueue delayer")
    common.add_impairments(p, "every node's link in the slowed job (with --slow-link-ms)")
    common.add_nodes(p, 4)
    common.add_warmup(p, 2)
    p.add_argument(
        "--quick", action="store_true", help=f"{QUICK_STEPS} steps per job: about a minute"
    )
    common.add_job_flags(p, _TRAIN_FIELDS, TRAIN_DEFAULTS, "one job")


def plan(args: argparse.Namespace) -> StragglerPlan:
    train = config_from_args(args, [*_TRAIN_FIELDS, "collective_timeout_s"], TRAIN_DEFAULTS)
    slowdown = args.slowdown
    if slowdown is None:
        slowdown = 1.0 if args.slow_link_ms else 4.0
    if args.quick:
        train = train.replace(steps=QUICK_STEPS)
    return StragglerPlan(
        rank=args.rank,
        slowdown=slowdown,
        cpus=args.cpus,
        slow_link_ms=args.slow_link_ms,
        shaper=args.shaper,
        nodes=args.nodes,
        warmup=args.warmup,
        train=train,
        **common.run_fields(args),
        impair=common.impairments(args),
    )


def report(result: StragglerResult) -> int:
    """Exit 0 when both jobs finished with parity, else 1."""
    return report_sweep(result, analyse, files=write_files, console=closing, page=page, name=NAME)
