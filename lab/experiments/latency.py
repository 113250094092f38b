"""``python -m lab latency``: real link latency between containers, and what bucketing and
overlap do about it.

One cluster serves the whole sweep. For each link delay the nodes' links are shaped and
verified (:mod:`lab.shaping`), then every configuration (bucket cap x overlap, plus a no-sync
floor) trains as its own job: same model, seed, data and steps. The whole plan runs ``rounds``
times in a row and each configuration's steps are pooled, so a slow drift of the shared host's
load does not favour whichever configuration ran in a quiet minute.

One module, read top to bottom in the order data flows: the plan (its configurations and
phases, pure, validated), the result, the verified link and the run on the engine, the
analysis (pure but for reading the collected logs: one summary object), then the table
(declared once for the page and the CSV), what is printed, the files and the page, each from
that summary alone; last the command's flags and :func:`report`. The per-bucket timings it
prints are a measurement any experiment can take (:mod:`lab.measure.buckets`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import statistics
import textwrap
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ddp.torchfree import (
    RankLog,
    Section,
    Text,
    TrainConfig,
    config_from_args,
    flag_of,
    load_run,
)
from ddp.torchfree import Table as PageTable
from lab import args as common
from lab.args import check_finite, check_job, check_warmup
from lab.engine.cluster import Cluster
from lab.engine.layout import Layout
from lab.engine.specs import DEFAULT_IMAGE
from lab.experiments import timeline
from lab.experiments.changed_job import ChangeTrigger, recheck
from lab.experiments.followed import train_for_parity
from lab.experiments.link_change import (
    ChangePlan,
    LinkChange,
    Recovery,
    add_change_flags,
    recovery,
    step_points,
)
from lab.experiments.sweep import run_sweep
from lab.measure.buckets import ConfigTiming, time_buckets
from lab.measure.windows import measured_steps, slowest_ms
from lab.report.common import figures_section
from lab.report.report import Closing, plan_settings
from lab.report.report import SweepResult as _Sweep
from lab.report.report import report as report_sweep
from lab.report.results import Results, ratio_text, sweep_results
from lab.report.table import Column, Table
from lab.shaping.changing import ChangingLink
from lab.shaping.impair import Impairments
from lab.shaping.link import ShapingReport
from lab.shaping.registry import CHOICES
from lab.shaping.verified_link import verified_link
from lab.words import count

__all__ = [
    "ACCUMULATE",
    "AUTO",
    "BANDWIDTH_BACKWARD_MS",
    "COLUMNS",
    "DEFAULT_CAPS",
    "DEFAULT_NODES",
    "DEFAULT_RATE_MBIT",
    "DEFINITIONS",
    "PHASE_BATCH",
    "QUICK",
    "TRAIN_DEFAULTS",
    "WORKLOAD",
    "ConfigRun",
    "ConfigStats",
    "Configuration",
    "Gantt",
    "Headline",
    "LatencyPlan",
    "LatencySummary",
    "LinkReport",
    "Phase",
    "Planned",
    "Row",
    "SweepResult",
    "accumulation_line",
    "add_arguments",
    "analyse",
    "auto_cap_lines",
    "change_lines",
    "closing",
    "combine_rounds",
    "default_phases",
    "default_timeline_cap",
    "derive_rows",
    "describe",
    "format_table",
    "format_timing",
    "headline",
    "headline_line",
    "job_name",
    "link",
    "overlap_by_cap_line",
    "page",
    "phase_groups",
    "plan",
    "plot_sweep",
    "report",
    "run",
    "summarize",
    "sweep_configurations",
    "table",
    "timeline_phase",
    "write_csv",
    "write_files",
    "write_json",
]

# The plan: the link delays, the phases and configurations run at each, and the training
# config of every one of them, validated before any container exists. Pure: tested without
# Docker.
#
# Configurations differ only in bucket cap, overlap, accumulation and sync mode: each one's
# ``TrainConfig`` is its phase's base config with those fields replaced (same model, seed, data,
# steps and simulated compute). The no-sync floor (no communication at all) runs first in each
# round of a phase; it is what "exposed communication" is measured from.
#
# A single-phase sweep (explicit ``--caps``, ``--rate-mbit``, ``--model``, ...) runs every cap
# with overlap on and off on one link per delay, as it always did. The default runs two phases
# per delay, because no one workload on a 2-core host shows both lessons strongly
# (docs/experiments/latency.md, "Why this default"): bucketing pays where allreduces are
# latency-bound (an unshaped-rate link, a short backward), overlap where they are
# bandwidth-bound and serial and backward is as long as they are (a rate cap, a long
# backward). What follows are the phases' link and model, and a single-phase sweep's defaults.
#
# Two nodes: on a 2-core host each rank then has a core, and communication is not starved
# during backward (with four ranks it is). The rate cap makes the 1.1 MB of the tower's
# gradients take ~470 ms of allreduce at 20 Mbit/s, serial. The single-phase batch: on this
# host the tower's real backward takes ~350-460 ms at 512, ~650 ms at 768, 1.3-1.7 s at 2048
# (once ~400 ms on a faster host), and it varies up to 2x between steps.
DEFAULT_NODES = 2
DEFAULT_RATE_MBIT = 20.0
# 0: one allreduce per tensor (82: the bucketing lesson); 0.15: five convolutions a bucket (7:
# the first fills after 1/6 of backward, the last holds the small first layers); 25: torch's
# default cap, one bucket here, which overlap cannot help.
DEFAULT_CAPS = (0.0, 0.15, 25.0)  # MB
# --quick: one round of fewer steps (a single-phase sweep: per-parameter vs the overlap cap).
QUICK = {"steps": 5, "rounds": 1, "caps": (0.0, 0.15)}
# The collective timeout is well below the run timeout, so a rank that lost a peer says so
# (its diagnosis) before lab stops the configuration.
TRAIN_DEFAULTS = TrainConfig(
    model="tower", steps=6, batch_size=768, seed=0, collective_timeout_s=60.0
)
# Both phases' global batch: the tower's real backward is then short (tens of ms), so in the
# latency-bound phase 82 per-parameter allreduces of ~25 ms each (two in flight) make the step,
# and a few buckets hardly add to it.
PHASE_BATCH = 16
# The bandwidth-bound phase's modelled accelerator backward (--backward-ms: a sleep spread over
# the gradients, which leaves the CPU to the communication): about as long as the 1.1 MB take
# at 20 Mbit/s (~470 ms, 7 buckets after backward). With real CPU compute instead (batch 768
# or 2048, backward 0.6-1.7 s on this host) the steps of one job varied 2x and overlap came out
# 0.8-0.9x: computation and communication share the two cores (docs/experiments/latency.md).
BANDWIDTH_BACKWARD_MS = 500.0
# The accumulation row's micro-batches per optimizer step.
ACCUMULATE = 4
AUTO = "auto"

WORKLOAD = (
    "The default runs two phases at each delay, because no one workload on a 2-core host shows "
    "both lessons strongly. Both train model tower (40 thin convolutions over the 32 features "
    "read as a signal: 82 tensors, 1.1 MB of gradients) on 2 nodes, one core and one thread "
    "per rank. The latency-bound phase (no rate cap, global batch "
    f"{PHASE_BATCH}: backward is short) runs per-parameter allreduce, caps 0.15 and 25 and "
    f"the auto cap with overlap on, and per-parameter with --accumulate {ACCUMULATE}: 82 "
    "allreduces of ~25 ms each make the step, a few buckets cost little (the bucketing "
    "lesson), and accumulation pays the 82 once per 4 micro-batches. The bandwidth-bound phase "
    f"(--rate-mbit, the same batch plus {BANDWIDTH_BACKWARD_MS:g} ms of modelled accelerator "
    "backward, as --backward-ms, against ~470 ms of allreduce) runs "
    "cap 0.15 (7 buckets, the first filling after 1/6 of backward) with overlap on and off, and "
    "the auto cap: overlap hides an allreduce only behind the backward that runs after its "
    "bucket filled, so backward must last about as long as the communication, and the "
    "communication must be bandwidth-bound and serial, or overlap off merges everything into "
    "one latency-bound allreduce and loses nothing (the overlap lesson). Any of --caps, "
    "--rate-mbit, --model, --batch-size, --backward-ms, --timeline-cap, --overlap (set to other "
    "than the default) makes it one phase of every cap with overlap on and off (or as --overlap "
    "says). Why: "
    "docs/experiments/latency.md, 'Why this default'."
)


@dataclass(frozen=True)
class Configuration:
    """One configuration: a bucket cap (MB, or "auto": the wrapper times the link at the
    rebuild and picks one), overlap and micro-batches per step; or (cap None) the floor."""

    cap_mb: float | str | None
    overlap: bool | None = None
    accumulate: int = 1

    @property
    def is_floor(self) -> bool:
        return self.cap_mb is None

    @property
    def is_auto(self) -> bool:
        return self.cap_mb == AUTO

    @property
    def name(self) -> str:
        """File-safe: part of the configuration's job name (its directory in the run)."""
        if self.cap_mb is None:
            return "nosync"
        cap = AUTO if self.is_auto else f"{self.cap_mb:g}"
        acc = f"-acc{self.accumulate}" if self.accumulate > 1 else ""
        return f"cap{cap}-{'overlap' if self.overlap else 'nooverlap'}{acc}"

    @property
    def label(self) -> str:
        if self.cap_mb is None:
            return "no sync (floor)"
        if self.is_auto:
            what = "auto cap"
        else:
            what = "per-parameter" if self.cap_mb == 0 else f"cap {self.cap_mb:g} MB"
        acc = f", accumulate {self.accumulate}" if self.accumulate > 1 else ""
        return f"{what}, overlap {'on' if self.overlap else 'off'}{acc}"

    def train_config(self, base: TrainConfig) -> TrainConfig:
        """``base`` with this configuration's fields. The floor keeps the simulated backward
        compute too, so exposed communication stays step time minus floor."""
        if self.cap_mb is None:
            return base.replace(sync="none")
        return base.replace(
            bucket_cap_mb=self.cap_mb, overlap=bool(self.overlap), accumulate=self.accumulate
        )


def sweep_configurations(
    caps: Sequence[float | str], overlaps: Sequence[bool] = (True, False)
) -> tuple[Configuration, ...]:
    """The floor, then per cap (a number of MB, or "auto") overlap on and off (adjacent, so
    slow drift of the shared host's load hits both alike), or only the ``overlaps`` given."""
    confs = [Configuration(None)]
    for cap in caps:
        confs += [Configuration(cap, overlap) for overlap in overlaps]
    return tuple(confs)


@dataclass(frozen=True)
class Phase:
    """One link (delay, rate cap) and workload, and the configurations run on it."""

    ms: float
    rate_mbit: float | None
    train: TrainConfig
    configurations: tuple[Configuration, ...]
    key: str = ""  # "" in a single-phase sweep; else part of every job name
    title: str = ""  # e.g. "latency-bound"
    lesson: str = ""  # what the phase shows and why

    @property
    def link_text(self) -> str:
        rate = f"rate {self.rate_mbit:g} Mbit/s" if self.rate_mbit else "no rate cap"
        return f"{self.ms:g} ms one-way, {rate}"

    @property
    def intro(self) -> str:
        """The phase's first line: its link, workload and lesson ('' in a single phase)."""
        if not self.key:
            return ""
        t = self.train
        modelled = (
            f", {t.backward_delay_ms:g} ms of modelled accelerator backward"
            if t.backward_delay_ms
            else ""
        )
        return (
            f"{self.title} phase ({self.link_text}, model {t.model}, global batch "
            f"{t.batch_size}{modelled}): {self.lesson}"
        )


_LATENCY_LESSON = (
    "shows bucketing: every allreduce pays the link's round trips whatever its size and "
    "backward is short, so 82 per-parameter allreduces make the step and a few buckets "
    "cost little; accumulation pays the same 82 once per 4 micro-batches"
)
_BANDWIDTH_LESSON = (
    "shows overlap: at the rate cap the 1.1 MB of gradients take about as long as backward, "
    "so buckets launched while backward runs hide behind it, and the same buckets sent after "
    "backward queue on the link; backward is a model of accelerator compute (a sleep), so "
    "it does not take the CPU the communication needs"
)


def default_phases(ms: float, train: TrainConfig, rate_mbit: float | None) -> tuple[Phase, ...]:
    """At ``ms``, both at global batch ``PHASE_BATCH``: the latency-bound phase (no rate cap:
    per-parameter vs bucketed, the auto cap, accumulation) and the bandwidth-bound phase
    (``rate_mbit`` and ``BANDWIDTH_BACKWARD_MS`` of modelled backward: one cap with overlap on
    and off, the auto cap)."""
    on = [Configuration(0.0, True), Configuration(0.15, True), Configuration(25.0, True)]
    latency = (
        Configuration(None),
        *on,
        Configuration(AUTO, True),
        Configuration(0.0, True, ACCUMULATE),
    )
    bandwidth = (
        Configuration(None),
        Configuration(0.15, True),
        Configuration(0.15, False),
        Configuration(AUTO, True),
    )
    small = train.replace(batch_size=PHASE_BATCH)
    modelled = small.replace(backward_delay_ms=BANDWIDTH_BACKWARD_MS)
    return (
        Phase(ms, None, small, latency, "latency", "latency-bound", _LATENCY_LESSON),
        Phase(
            ms, rate_mbit, modelled, bandwidth, "bandwidth", "bandwidth-bound", _BANDWIDTH_LESSON
        ),
    )


def job_name(conf: Configuration, ms: float, round_: int, phase: str = "") -> str:
    """The job of one run of a configuration: ``runs/<run-id>/<job>/`` (``phase``: the phase's
    key in a two-phase sweep)."""
    return f"{ms:g}ms-{phase + '-' if phase else ''}{conf.name}-r{round_}"


@dataclass(frozen=True)
class Planned:
    """One job of the sweep, in run order."""

    ms: float
    round: int
    conf: Configuration
    job: str
    train: TrainConfig
    phase: Phase | None = None


@dataclass(frozen=True)
class LatencyPlan:
    """What ``python -m lab latency`` measures, and its bounds."""

    ms: tuple[float, ...] = (5.0,)  # one-way delay per packet
    shaper: str = "auto"
    rate_mbit: float | None = DEFAULT_RATE_MBIT  # None: no rate cap
    caps: tuple[float | str, ...] = DEFAULT_CAPS  # MB, or "auto": the wrapper picks its cap
    warmup: int = 2  # first steps include gloo's connection set-up: not measured
    rounds: int = 2  # the whole plan runs this often, interleaved: load drift hits all alike
    nodes: int = DEFAULT_NODES
    train: TrainConfig = field(default_factory=lambda: TRAIN_DEFAULTS)
    timeline_cap: float | None = None  # None: the fastest bucketed cap with overlap on
    run_timeout_s: float = 300.0  # wall time of one configuration
    image: str = DEFAULT_IMAGE
    runs_dir: Path = Path("runs")
    progress: bool = True
    impair: Impairments = field(default_factory=Impairments)  # jitter, loss on every node
    node_ms: tuple[tuple[int, float], ...] = ()  # (node, ms): a node whose delay differs
    cpus: float | None = None  # every node's CPU limit in cores (None: no limit)
    # The default: two phases per delay (default_phases; rate_mbit and train are then
    # the bandwidth-bound phase's, caps unused); False: one phase per delay, every cap on/off.
    phased: bool = False
    overlaps: tuple[bool, ...] = (True, False)  # a single-phase sweep's: every cap with each
    change: ChangePlan | None = None  # every node's link changes during every job

    def __post_init__(self) -> None:
        if not self.ms:
            raise ValueError("give at least one --ms value")
        nodes = [n for n, _ in self.node_ms]
        if any(not 0 <= n < self.nodes for n in nodes) or len(set(nodes)) != len(nodes):
            raise ValueError(
                f"--node-ms names nodes {nodes}: each at most once, and the nodes are "
                f"0..{self.nodes - 1}"
            )
        for ms in self.ms:
            check_finite("--ms", ms, 0.0)
        if len(set(self.ms)) != len(self.ms):
            raise ValueError(f"--ms values repeat: {list(self.ms)}; give each delay once")
        if self.shaper not in CHOICES:
            raise ValueError(f"--shaper must be one of {', '.join(CHOICES)}, got {self.shaper!r}")
        if self.rate_mbit is not None and not (
            math.isfinite(self.rate_mbit) and self.rate_mbit > 0
        ):
            raise ValueError("--rate-mbit must be a finite number > 0 (--rate-mbit 0: no limit)")
        if not self.caps:
            raise ValueError("--caps is empty; e.g. --caps 0,0.25,1,4,25")
        for cap in self.caps:
            if cap != AUTO:
                check_finite("--caps", cap, 0.0)
        if not self.overlaps or len(set(self.overlaps)) != len(self.overlaps):
            raise ValueError(f"overlaps must be (True,), (False,) or both, got {self.overlaps}")
        if len(set(self.caps)) != len(self.caps):
            raise ValueError(f"--caps values repeat: {list(self.caps)}; give each cap once")
        check_warmup(self.warmup, self.train.steps)
        if self.rounds < 1:
            raise ValueError(f"--rounds must be an integer >= 1, got {self.rounds!r}")
        if self.nodes < 2:
            raise ValueError(f"--nodes must be >= 2 (a link needs two ends), got {self.nodes}")
        if self.timeline_cap is not None and self.timeline_cap not in self.caps:
            raise ValueError(
                f"--timeline-cap {self.timeline_cap:g} is not one of --caps "
                f"{','.join(str(c) if c == AUTO else f'{c:g}' for c in self.caps)}"
            )
        if self.cpus is not None and not (math.isfinite(self.cpus) and self.cpus > 0):
            raise ValueError(
                f"--cpus must be a finite number > 0 (cores per node), got {self.cpus!r}"
            )
        for phase in self.phases():
            check_job(phase.train, self.run_timeout_s, self.nodes, "configuration")
            if self.change is not None:
                self.change.check(phase.train.steps, self.warmup)
        if self.change is not None and (self.impair or self.node_ms):
            raise ValueError(
                "--change-at-step changes every node's delay and rate alike; it does not "
                "combine with --node-ms or the impairments (--jitter-ms, --loss-pct)"
            )

    @property
    def layout(self) -> Layout:
        return Layout(self.nodes, 1)

    def phases(self) -> list[Phase]:
        """Every phase, in run order: per delay, the default's two phases (``phased``), or one
        phase of every cap with overlap on and off on the plan's link."""
        if self.phased:
            return [p for ms in self.ms for p in default_phases(ms, self.train, self.rate_mbit)]
        confs = sweep_configurations(self.caps, self.overlaps)
        return [Phase(ms, self.rate_mbit, self.train, confs) for ms in self.ms]

    def configurations(self) -> list[Configuration]:
        """The configurations of every phase at a delay, in order (the floor first)."""
        return [c for p in self.phases() if p.ms == self.ms[0] for c in p.configurations]

    def jobs(self, setting: Phase | float) -> list[Planned]:
        """The jobs of one phase (or of a single-phase sweep's delay): every round runs every
        configuration, interleaved, so slow drift of the host's load hits all alike."""
        phase = setting
        if not isinstance(phase, Phase):
            confs = sweep_configurations(self.caps, self.overlaps)
            phase = Phase(setting, self.rate_mbit, self.train, confs)
        return [
            Planned(
                phase.ms,
                r,
                c,
                job_name(c, phase.ms, r, phase.key),
                c.train_config(phase.train),
                phase,
            )
            for r in range(1, self.rounds + 1)
            for c in phase.configurations
        ]

    @property
    def total(self) -> int:
        return self.rounds * sum(len(p.configurations) for p in self.phases())


# What a sweep produced, as plain data: the verified links and every configuration's run.
# Docker-free, so the report and its tests build on it without the engine.


@dataclass(frozen=True)
class ConfigStats:
    """What one configuration's logs say, before comparing it with the others."""

    calls: int  # allreduce calls per measured step (the plan is rebuilt after step 1)
    median_step_ms: float
    median_comm_ms: float  # slowest rank's wait for allreduces after backward, median
    steps_measured: int
    auto_caps: tuple[float, ...] = ()  # bucket_cap_mb="auto": the cap chosen, per run


@dataclass
class LinkReport:
    """The verified link of one delay, or of one phase (``phase``: its key) in a two-phase
    sweep (``shaper`` "none" when nothing was shaped)."""

    ms: float
    shaper: str
    note: str = ""
    line: str = ""
    rtt_p50_ms: float | None = None
    rtt_p90_ms: float | None = None
    baseline_p50_ms: float | None = None
    phase: str = ""


@dataclass
class ConfigRun:
    """One run (one round) of one configuration: its job, how its ranks exited, and this run's
    statistics (from the records the ranks streamed; the report re-reads the collected logs)."""

    conf: Configuration
    ms: float
    round: int
    job: str
    codes: dict[int, int]
    stats: ConfigStats
    parity: bool | None  # None for the floor: replicas drift by design
    seconds: float
    phase: Phase | None = None  # None: a single-phase sweep's run (before phases existed)
    change: LinkChange | None = None  # --change-at-step: what happened to the link
    recovery: Recovery | None = None  # and the steps around it

    @property
    def phase_key(self) -> str:
        return self.phase.key if self.phase else ""


class SweepResult(_Sweep[LatencyPlan, LinkReport, ConfigRun]):
    """The sweep: the verified link of every delay, every configuration's run in run order."""


# The sweep's link of one phase (a delay and a rate cap): the cluster's nodes shaped and
# verified (:func:`lab.shaping.verified_link.verified_link`) for as long as the phase's
# configurations run.


def _reported(phase: Phase, rep: ShapingReport) -> LinkReport:
    """What the probe measured on the phase's link, its note led by the phase's intro."""
    note = "\n".join(n for n in (phase.intro, rep.note) if n)
    return LinkReport(
        phase.ms,
        rep.shaper,
        note,
        rep.line(),
        rep.measured.get("p50_ms"),
        rep.measured.get("p90_ms"),
        rep.baseline.get("p50_ms"),
        phase.key,
    )


@contextlib.contextmanager
def link(
    cluster: Cluster, plan: LatencyPlan, phase: Phase, max_seconds: float
) -> Iterator[LinkReport]:
    """Shape the cluster's links at the phase's delay and rate cap, yield what was measured
    (its note led by the phase's intro), undo on the way out. ``max_seconds`` bounds the
    processes the shaping leaves in the nodes."""
    ms, rate = phase.ms, phase.rate_mbit
    if ms == 0 and not (rate or plan.impair or plan.node_ms):
        line = "link unshaped (--ms 0): the bridge's own latency"
        yield LinkReport(ms, "none", phase.intro, line, phase=phase.key)
        return
    where = f"at {ms:g} ms" + (f" ({phase.title} phase)" if phase.key else "")
    with verified_link(
        cluster,
        where,
        ms,
        plan.shaper,
        rate,
        max_seconds=max_seconds,
        node_ms=dict(plan.node_ms),
        impair=plan.impair,
    ) as rep:
        yield _reported(phase, rep)


# The run (:func:`lab.experiments.sweep.run_sweep`): per delay a shaped, verified link; per
# configuration and round a training job followed through its records, its statistics taken
# from the records the ranks streamed, and a line printed when it finished. With
# ``--change-at-step`` the link is a :class:`lab.shaping.changing.ChangingLink`: re-shaped when
# rank 0 reports the step (:mod:`lab.experiments.changed_job`), verified again once idle after
# the job, and shaped back before the next one.


def _in(p: Planned) -> str:
    return f", {p.phase.title} phase" if p.phase and p.phase.key else ""


def _run_config(
    cluster: Cluster,
    plan: LatencyPlan,
    p: Planned,
    echo: Callable,
    trigger: ChangeTrigger | None = None,
) -> ConfigRun:
    started = time.monotonic()
    where = f"{p.conf.label} at {p.ms:g} ms{_in(p)} (round {p.round})"
    slow = "a low --rate-mbit makes steps slow"
    job, held = train_for_parity(
        cluster, p.job, p.train, plan, where=where, slow_hint=slow, echo=echo, on_event=trigger
    )
    logs = {rank: RankLog(rank, records) for rank, records in job.records.items()}
    stats = summarize([(f"job {p.job}", logs)], plan.warmup)
    parity = None if p.conf.is_floor else held
    run = ConfigRun(
        p.conf, p.ms, p.round, p.job, job.codes, stats, parity, time.monotonic() - started, p.phase
    )
    if trigger is not None and trigger.fired:
        run.change = trigger.change
        run.recovery = recovery(
            step_points(logs), trigger.change.asked_step, trigger.change.applied_t, plan.warmup
        )
    return run


def _header(result: SweepResult) -> str:
    plan: LatencyPlan = result.plan
    at = f"at {', '.join(f'{m:g}' for m in plan.ms)} ms"
    if plan.phased:
        phases = plan.phases()[:2]
        what = ", ".join(f"{p.title} {len(p.configurations)}" for p in phases)
        confs = f"2 phases ({what} configurations)"
    else:
        confs = f"model {plan.train.model}, {count(len(plan.configurations()), 'configuration')}"
    return (
        f"run {result.run_id}: {count(plan.nodes, 'node')}, {confs} x "
        f"{count(plan.rounds, 'round')} x {count(plan.train.steps, 'step')} {at}; "
        f"output in {result.run_dir}/"
    )


def describe(run: ConfigRun, done: int, total: int) -> str:
    """The line printed when one configuration finished."""
    parity = "" if run.parity is None else f"  parity {'holds' if run.parity else 'BROKEN'}"
    phase = f" {run.phase.title}" if run.phase_key and run.phase else ""
    return (
        f"[{done:>2}/{total}] {run.ms:g} ms{phase} round {run.round}  {run.conf.label:<27} "
        f"{run.stats.calls:>3} allreduce/step  median step {run.stats.median_step_ms:8.1f} ms"
        f"{parity}  ({run.seconds:.0f} s)"
    )


def _changing(held: dict[str, ChangingLink]) -> tuple[Callable, Callable]:
    """The sweep's link and job runner for a link that changes during each job: the phase's
    link held in ``held`` for the jobs, which change it and shape it back."""

    @contextlib.contextmanager
    def phase_link(
        cluster: Cluster, plan: LatencyPlan, phase: Phase, max_seconds: float
    ) -> Iterator[LinkReport]:
        with ChangingLink(cluster, plan.shaper, max_seconds, f"at {phase.ms:g} ms") as live:
            held["link"] = live
            rep = live.set(phase.ms, phase.rate_mbit)
            if rep is None:
                line = "link unshaped (--ms 0)"
                yield LinkReport(phase.ms, "none", phase.intro, line, phase=phase.key)
            else:
                yield _reported(phase, rep)

    def run_job(cluster: Cluster, plan: LatencyPlan, p: Planned, echo: Callable) -> ConfigRun:
        live = held["link"]
        assert p.phase is not None and plan.change is not None
        again = live.ensure(p.phase.ms, p.phase.rate_mbit)
        if again is not None:
            echo(f"link shaped back: {again.line().splitlines()[0]}")
        trigger = ChangeTrigger(live, plan.change, echo)
        run = _run_config(cluster, plan, p, echo, trigger)
        if trigger.fired:
            idle = recheck(live, plan.change)
            if idle is not None:
                echo(f"  the changed link, idle after the job: {idle.line().splitlines()[0]}")
        return run

    return phase_link, run_job


def run(plan: LatencyPlan, echo: Callable[[str], None] = print) -> SweepResult:
    """Start the nodes, shape and verify each phase's link, run its configurations; the cluster
    collects the logs into ``runs_dir/<run-id>/<job>/`` and removes everything, always."""
    cpus = {n: plan.cpus for n in range(plan.nodes)} if plan.cpus else None
    phase_link, run_job = link, _run_config
    if plan.change is not None:
        phase_link, run_job = _changing({})
    return run_sweep(
        plan,
        plan.phases(),
        new_result=SweepResult,
        header=_header,
        link=phase_link,
        run_job=run_job,
        describe=describe,
        echo=echo,
        cpus=cpus,
    )


# The analysis: a configuration's numbers from its rank logs (``ddp.torchfree.RankLog``), the
# table rows derived by comparing configurations at one delay, the two ratios of the headline,
# and the Gantt chart's pair; :func:`analyse` turns a sweep's result into the one
# :class:`LatencySummary` the files, the console text and the page are built from.
#
# The logs are either collected from the run (``ddp.torchfree.load_run``) or built from the
# records the ranks streamed while running; both are the same typed records. Pure but for
# reading the collected logs: tested from synthetic logs.

DEFINITIONS = {
    "median step time": (
        "for every measured step (warm-up steps excluded: they include gloo's connection "
        "set-up) the slowest rank's step_ms, since the job waits for it; then the median "
        "over steps"
    ),
    "exposed communication": (
        "median step time minus that of the no-sync floor at the same link delay (same steps, "
        "same data, no communication): what communication adds to a step after any overlap"
    ),
    "speedup vs per-parameter": (
        "the per-parameter (cap 0) median step time per sample with the same overlap setting "
        "(in the same phase) divided by this configuration's"
    ),
    "comm ms/sample": (
        "the median communication wait (the slowest rank's wait for allreduces after "
        "backward) per sample of the optimizer step: accumulating K micro-batches "
        "divides it by about K"
    ),
    "bucketing speedup": (
        "the faster per-parameter configuration (overlap on or off) divided by the fastest "
        "bucketed one (any fixed cap > 0, overlap on or off), in the first phase that ran both "
        "(the default's latency-bound phase, where both have overlap on)"
    ),
    "overlap gain": (
        "the fastest configuration with overlap off divided by the fastest with overlap on, "
        "each over every fixed cap (per-parameter included), in the first phase that ran both "
        "(the default's bandwidth-bound phase): what overlap buys once the cap is tuned for "
        "each setting"
    ),
}

Logs = Mapping[int, RankLog]


def _auto_cap(logs: Logs) -> float | None:
    """The cap ``bucket_cap_mb="auto"`` chose (the same on every rank)."""
    return next((log.auto_cap_mb for log in logs.values() if log.auto_cap_mb is not None), None)


def _calls(calls: set[int], auto: bool) -> int:
    """The allreduce calls per step of a configuration's runs: one number, but the auto cap
    may choose differently in different runs (then the most buckets, the worst case)."""
    if len(calls) != 1 and not (auto and calls):
        raise ValueError(f"runs of one configuration disagree on allreduce calls: {calls}")
    return max(calls)


def summarize(runs: Sequence[tuple[str, Logs]], warmup: int) -> ConfigStats:
    """Statistics of one configuration pooled over its runs (rounds), given as ``(where, logs)``
    (``where`` names the run in errors); each run's first ``warmup`` steps are left out. A
    step's time is its slowest rank's (the job waits for it). ValueError if the logs cannot
    give them."""
    calls: set[int] = set()
    step_ms: list[float] = []
    comm_ms: list[float] = []
    autos: list[float] = []
    for where, logs in runs:
        if not logs:
            raise ValueError(f"{where}: no rank logs")
        configs = [log.config for log in logs.values()]
        if any(c is None for c in configs):
            raise ValueError(f"{where}: a rank log has no config record (did the rank start?)")
        measured = measured_steps(logs, warmup, where)
        counts = {r.num_buckets for recs in measured.values() for r in recs}
        if None in counts:  # logs of a ddp that did not record it: the construction plan
            counts = {c.num_buckets for c in configs if c is not None}
        calls.update(n for n in counts if n is not None)
        autos += [cap for cap in [_auto_cap(logs)] if cap is not None]
        step_ms += slowest_ms(measured)
        comm_ms += [max(r.comm_ms for r in recs) for _, recs in sorted(measured.items())]
    return ConfigStats(
        calls=_calls(calls, bool(autos)),
        median_step_ms=statistics.median(step_ms),
        median_comm_ms=statistics.median(comm_ms),
        steps_measured=len(step_ms),
        auto_caps=tuple(autos),
    )


@dataclass(frozen=True)
class Row:
    """One line of the table / CSV. ``cap_mb`` and ``overlap`` are None for the no-sync floor,
    ``cap_mb`` "auto" for the auto cap (``auto_caps``: what it chose, per round); ``parity`` is
    None where it does not apply (no sync: replicas drift by design); ``phase`` the phase's
    key in a two-phase sweep; ``samples`` the global samples per optimizer step."""

    ms: float
    config: str
    cap_mb: float | str | None
    overlap: bool | None
    calls: int
    median_step_ms: float
    median_comm_ms: float
    steps_measured: int
    parity: bool | None
    exposed_comm_ms: float = math.nan
    speedup_vs_per_parameter: float = math.nan
    phase: str = ""
    accumulate: int = 1
    samples: int = 0
    auto_caps: tuple[float, ...] = ()

    @property
    def is_floor(self) -> bool:
        return self.cap_mb is None

    @property
    def is_auto(self) -> bool:
        return self.cap_mb == "auto"

    @property
    def is_bucketed(self) -> bool:
        """A fixed cap above 0 (not per-parameter, not the auto cap, not the floor)."""
        return isinstance(self.cap_mb, int | float) and self.cap_mb > 0

    @property
    def comm_ms_per_sample(self) -> float:
        """Communication wait per sample of the step: what accumulation divides by K."""
        return self.median_comm_ms / self.samples if self.samples else math.nan

    def ms_per_sample(self) -> float:
        return self.median_step_ms / self.samples if self.samples else self.median_step_ms

    @property
    def parity_text(self) -> str:
        return "n/a (no sync)" if self.parity is None else ("holds" if self.parity else "BROKEN")


def derive_rows(rows: list[Row]) -> list[Row]:
    """Fill exposed communication (not for accumulation: its floor would be K micro-batches)
    and speedup vs per-parameter (per sample), per latency value and phase."""
    out = []
    for row in rows:
        same = [r for r in rows if (r.ms, r.phase) == (row.ms, row.phase)]
        floor = next((r for r in same if r.is_floor), None)
        exposed = math.nan
        if floor and row.accumulate == 1:
            exposed = row.median_step_ms - floor.median_step_ms
        speedup = math.nan
        if not row.is_floor:
            base = next(
                (
                    r
                    for r in same
                    if r.cap_mb == 0 and r.overlap == row.overlap and r.accumulate == 1
                ),
                None,
            )
            if base is not None:
                speedup = base.ms_per_sample() / row.ms_per_sample()
        out.append(
            dataclasses.replace(row, exposed_comm_ms=exposed, speedup_vs_per_parameter=speedup)
        )
    return out


def phase_groups(rows: Sequence[Row], ms: float) -> list[list[Row]]:
    """The rows at delay ``ms``, one list per phase in run order (one list in a single-phase
    sweep): the ratios compare configurations within a phase, on one link and workload."""
    keys = dict.fromkeys(r.phase for r in rows if r.ms == ms)
    return [[r for r in rows if r.ms == ms and r.phase == key] for key in keys]


def _row(result: SweepResult, group: list[ConfigRun]) -> Row:
    """One configuration's row: its rounds' steps pooled from the collected logs, parity
    required in every round."""
    logs = [(str(result.log_dir(run)), load_run(result.log_dir(run))) for run in group]
    stats = summarize(logs, result.plan.warmup)
    parities = [run.parity for run in group]
    run = group[0]
    conf, train = run.conf, (run.phase.train if run.phase else result.plan.train)
    return Row(
        run.ms,
        conf.label,
        conf.cap_mb,
        conf.overlap,
        stats.calls,
        stats.median_step_ms,
        stats.median_comm_ms,
        stats.steps_measured,
        None if None in parities else all(parities),
        phase=run.phase_key,
        accumulate=conf.accumulate,
        samples=train.batch_size * conf.accumulate,
        auto_caps=stats.auto_caps,
    )


def combine_rounds(result: SweepResult) -> list[Row]:
    """One row per (delay, phase, configuration), in run order."""
    groups: dict[tuple[float, str, str], list[ConfigRun]] = {}
    for run in result.runs:
        groups.setdefault((run.ms, run.phase_key, run.conf.name), []).append(run)
    return derive_rows([_row(result, group) for group in groups.values()])


@dataclass(frozen=True)
class Headline:
    """The two ratios of the closing line at one delay, and the configurations each compares."""

    ms: float
    bucketing_speedup: float
    per_parameter: str
    best_bucketed: str
    overlap_gain: float
    best_no_overlap: str
    best_overlap: str


def _fastest(rows: list[Row]) -> Row | None:
    return min(rows, key=lambda r: r.median_step_ms, default=None)


def _ratio_in(
    groups: list[list[Row]], slow: Callable[[Row], bool], fast: Callable[[Row], bool]
) -> tuple[float, str, str]:
    """Fastest of ``slow``'s rows over fastest of ``fast``'s, in the first group with both."""
    for rows in groups:
        a, b = _fastest([r for r in rows if slow(r)]), _fastest([r for r in rows if fast(r)])
        if a and b:
            return a.median_step_ms / b.median_step_ms, a.config, b.config
    return math.nan, "-", "-"


def headline(rows: list[Row], ms: float) -> Headline:
    """The two ratios of the closing line at latency ``ms`` (NaN where a side was not run),
    each within one phase, over fixed caps without accumulation."""
    groups = [
        [r for r in g if not r.is_floor and not r.is_auto and r.accumulate == 1]
        for g in phase_groups(rows, ms)
    ]
    bucketing = _ratio_in(groups, lambda r: r.cap_mb == 0, lambda r: r.is_bucketed)
    overlap = _ratio_in(groups, lambda r: r.overlap is False, lambda r: r.overlap is True)
    return Headline(ms, *bucketing, *overlap)


def timeline_phase(rows: Sequence[Row], ms: float) -> str:
    """The phase of the Gantt chart at ``ms``: the first that ran a cap with overlap on and off
    (the default's bandwidth-bound phase), else the last."""
    groups = phase_groups(rows, ms)
    for group in groups:
        if {r.overlap for r in group if r.is_bucketed or r.cap_mb == 0} >= {True, False}:
            return group[0].phase
    return groups[-1][0].phase if groups else ""


def default_timeline_cap(rows: Sequence[Row], ms: float, phase: str = "") -> float | None:
    """The fastest bucketed cap with overlap on at ``ms`` (in ``phase``) among those with
    several buckets (one bucket has nothing to overlap: its allreduce starts when backward
    ends): the configuration a user would pick, shown beside the same cap with overlap off."""
    fixed = [r for r in rows if r.ms == ms and r.phase == phase and r.accumulate == 1]
    fixed = [r for r in fixed if r.is_bucketed or r.cap_mb == 0]
    bucketed = [r for r in fixed if r.cap_mb and r.overlap and r.calls > 1]
    if not bucketed:
        bucketed = [r for r in fixed if r.cap_mb and r.overlap]
    if not bucketed:
        bucketed = fixed
    best = min(bucketed, key=lambda r: r.median_step_ms, default=None)
    return None if best is None else best.cap_mb  # type: ignore[return-value]


@dataclass
class Gantt:
    """Round 1 at the largest delay: every allreduce configuration's representative step
    (``traced``, the Chrome trace), and the pair of ``cap`` in ``phase``, overlap on and off
    (``pair``, the Gantt chart) with its per-bucket ``timings``. ``ms`` None: nothing ran."""

    ms: float | None = None
    cap_mb: float | None = None
    phase: str = ""
    steps: dict[str, int] = field(default_factory=dict)  # configuration -> the step shown
    traced: list[timeline.StepTimeline] = field(default_factory=list)
    pair: list[timeline.StepTimeline] = field(default_factory=list)
    timings: list[ConfigTiming] = field(default_factory=list)


def _title(run: ConfigRun) -> str:
    phase = f"{run.phase.title}, " if run.phase and run.phase_key else ""
    return f"{run.ms:g} ms, {phase}{run.conf.label}"


def _gantt(result: SweepResult, rows: list[Row]) -> Gantt:
    ms = max((r.ms for r in rows), default=None)
    if ms is None:
        return Gantt()
    phase = timeline_phase(rows, ms)
    cap = result.plan.timeline_cap
    if cap is None:
        cap = default_timeline_cap(rows, ms, phase)
    gantt = Gantt(ms, cap, phase)
    warmup = result.plan.warmup
    for run in result.runs:
        if run.ms != ms or run.round != 1 or run.conf.is_floor:
            continue
        logs, where = load_run(result.log_dir(run)), str(result.log_dir(run))
        step = timeline.representative_step(logs, warmup, where)
        gantt.steps["-".join(k for k in (run.phase_key, run.conf.name) if k)] = step
        conf = run.conf
        traced = timeline.load_step(logs, step, _title(run), where, bool(conf.overlap))
        gantt.traced.append(traced)
        if conf.cap_mb == cap and run.phase_key == phase and conf.accumulate == 1:
            gantt.pair.append(traced)
            gantt.timings.append(time_buckets(logs, warmup, conf.label, bool(conf.overlap), where))
    return gantt


@dataclass
class LatencySummary:
    """Everything ``lab latency`` reports about one sweep: the rows, the headline of every
    delay, the Gantt chart's pair; and the result they came from."""

    result: SweepResult
    rows: list[Row]
    headlines: list[Headline]
    gantt: Gantt

    @property
    def broken(self) -> str:
        broken = [r.config for r in self.rows if r.parity is False]
        return f"parity BROKEN in: {'; '.join(broken)}" if broken else ""


def analyse(result: SweepResult) -> LatencySummary:
    """The sweep's summary from the collected logs; ValueError if they cannot give it."""
    rows = combine_rounds(result)
    headlines = [headline(rows, ms) for ms in dict.fromkeys(r.ms for r in rows)]
    return LatencySummary(result, rows, headlines, _gantt(result, rows))


# The table: one row per delay, phase and configuration, declared once; the page's table and
# latency.csv are renderings of it (the page shows eight of its columns, in the files' order;
# a figure not measured is "-" on the page and an empty cell in the CSV). latency.json keeps
# the rows as the Row records themselves.

_PAGE_AND_FILES = frozenset({"page", "files"})
_FILES_ONLY = frozenset({"files"})

COLUMNS: list[Column] = [
    Column("ms", "delay", lambda r: r.ms, unit="ms", digits=None, places=_PAGE_AND_FILES),
    Column("config", "configuration", lambda r: r.config, places=_PAGE_AND_FILES),
    Column(
        "bucket_cap_mb",
        "bucket cap",
        lambda r: r.cap_mb,
        unit="MB",
        digits=None,
        places=_FILES_ONLY,
    ),
    Column("overlap", "overlap", lambda r: r.overlap, places=_FILES_ONLY),
    Column("allreduce_calls_per_step", "allreduce/step", lambda r: r.calls, places=_PAGE_AND_FILES),
    Column(
        "median_step_ms",
        "median step",
        lambda r: r.median_step_ms,
        unit="ms",
        places=_PAGE_AND_FILES,
    ),
    Column(
        "exposed_comm_ms",
        "exposed comm",
        lambda r: r.exposed_comm_ms,
        unit="ms",
        places=_PAGE_AND_FILES,
    ),
    Column(
        "median_comm_wait_ms",
        "median comm wait",
        lambda r: r.median_comm_ms,
        unit="ms",
        places=_FILES_ONLY,
    ),
    Column(
        "speedup_vs_per_parameter",
        "speedup vs per-param",
        lambda r: r.speedup_vs_per_parameter,
        places=_PAGE_AND_FILES,
    ),
    Column("parity", "parity", lambda r: r.parity_text, places=_PAGE_AND_FILES),
    Column("steps_measured", "steps measured", lambda r: r.steps_measured, places=_PAGE_AND_FILES),
    Column("phase", "phase", lambda r: r.phase, places=_FILES_ONLY),
    Column("accumulate", "accumulate", lambda r: r.accumulate, places=_FILES_ONLY),
    Column("samples_per_step", "samples/step", lambda r: r.samples, places=_FILES_ONLY),
    Column(
        "comm_ms_per_sample",
        "comm/sample",
        lambda r: r.comm_ms_per_sample,
        unit="ms",
        digits=6,
        places=_FILES_ONLY,
    ),
    Column(
        "auto_cap_mb",
        "auto cap",
        lambda r: ";".join(f"{c:g}" for c in r.auto_caps),
        unit="MB",
        places=_FILES_ONLY,
    ),
]


def table(rows: Sequence[Row]) -> Table:
    """The sweep's rows in the declared columns."""
    return Table(COLUMNS, rows)


# What is printed: the table (a block per delay and phase, a phase's block led by what it
# shows and why) and the per-bucket timings of the Gantt chart's pair, then (after the 'took'
# line and what broke) the per-cap overlap line, the auto cap's and accumulation's lines and
# the headline. Pure.
#
# The console table is aligned by hand: a figure not measured is "-" (lab.report.table prints
# "n/a"), the configuration column is as wide as the longest label, and samples/step sits
# before the step time, out of the files' order. The per-bucket table likewise: indented under
# its caption, its buckets named b0, b1, ...
#
# The auto cap (``bucket_cap_mb="auto"``) is chosen by the wrapper at the bucket rebuild, from
# a timing of the link and of the last backward, so it may differ from round to round: every
# round's choice is shown. Accumulating K micro-batches per optimizer step sends the same
# allreduces once per K x batch samples: the communication wait per sample should fall about
# K-fold while parity still holds against one process on the whole K x batch.


def overlap_by_cap_line(rows: list[Row], ms: float) -> str:
    """Overlap's gain at each cap (overlap-off step time / overlap-on), at latency ``ms``: the
    headline compares the best of each side, this shows where overlap matters (small and
    medium buckets, whose allreduces can start while backward still runs)."""
    parts = []
    for group in phase_groups(rows, ms):
        fixed = [r for r in group if not r.is_floor and not r.is_auto and r.accumulate == 1]
        for cap in dict.fromkeys(r.cap_mb for r in fixed):
            on = [r for r in fixed if r.cap_mb == cap and r.overlap is True]
            off = [r for r in fixed if r.cap_mb == cap and r.overlap is False]
            if on and off:
                what = "per-parameter" if cap == 0 else f"{cap:g} MB"
                parts.append(f"{what} {off[0].median_step_ms / on[0].median_step_ms:.2f}x")
    return f"overlap gain per cap at {ms:g} ms: {', '.join(parts) or '-'}"


def _fastest_fixed(rows: Sequence[Row], overlap: bool | None) -> Row | None:
    fixed = [r for r in rows if r.is_bucketed or r.cap_mb == 0]
    fixed = [r for r in fixed if r.accumulate == 1 and r.overlap is overlap]
    return min(fixed, key=lambda r: r.median_step_ms, default=None)


def _chosen(caps: Sequence[float]) -> str:
    return ", ".join(f"{cap:g} MB (round {i})" for i, cap in enumerate(caps, 1)) or "nothing"


def auto_cap_lines(rows: Sequence[Row], ms: float) -> list[str]:
    """Per phase with an auto cap row at ``ms``: the cap chosen in every round, its
    allreduces per step, and its step time against the fastest fixed cap's (same overlap)."""
    lines = []
    for group in phase_groups(rows, ms):
        for auto in (r for r in group if r.is_auto):
            where = f", {auto.phase}-bound phase" if auto.phase else ""
            best = _fastest_fixed(group, auto.overlap)
            versus = "no fixed cap ran beside it"
            if best is not None:
                versus = (
                    f"step {auto.median_step_ms / best.median_step_ms:.2f}x the fastest fixed "
                    f"cap's ({best.config}: {best.median_step_ms:.1f} ms)"
                )
            lines.append(
                f"auto cap at {ms:g} ms{where}: chose {_chosen(auto.auto_caps)}, "
                f"{count(auto.calls, 'allreduce')}/step, median step "
                f"{auto.median_step_ms:.1f} ms, {versus}"
            )
    return lines


def accumulation_line(rows: Sequence[Row], ms: float) -> str:
    """Communication per sample with K micro-batches per step against the same configuration
    without accumulation, at ``ms`` ('' when no accumulation row ran beside its base)."""
    for group in phase_groups(rows, ms):
        for acc in (r for r in group if r.accumulate > 1 and not r.is_floor):
            base = next(
                (
                    r
                    for r in group
                    if r.accumulate == 1 and (r.cap_mb, r.overlap) == (acc.cap_mb, acc.overlap)
                ),
                None,
            )
            if base is None or not (base.samples and acc.samples and acc.median_comm_ms > 0):
                continue
            drop = base.comm_ms_per_sample / acc.comm_ms_per_sample
            calls = (base.calls / base.samples) / (acc.calls / acc.samples)
            return (
                f"accumulation at {ms:g} ms: communication per sample {drop:.1f}x lower with "
                f"accumulate {acc.accumulate} ({base.config}: {base.calls} allreduces per "
                f"{base.samples} -> {acc.samples} samples, {calls:.1f}x fewer per sample; comm "
                f"wait {base.median_comm_ms:.1f} -> {acc.median_comm_ms:.1f} ms per step, "
                f"{base.comm_ms_per_sample:.2f} -> {acc.comm_ms_per_sample:.2f} ms per sample)"
            )
    return ""


def headline_line(h: Headline) -> str:
    """The command's last line, in the exact form the issue asks for; a ratio whose sides were
    not both run (e.g. --caps without 0) says which side is missing instead of "nanx"."""
    bucketing = _ratio(h.bucketing_speedup, "n/a (--caps has no 0 or no bucketed cap)")
    overlap = _ratio(h.overlap_gain, "n/a (overlap on and off not both run)")
    return (
        f"bucketing speedup at {h.ms:g} ms: {bucketing} (per-parameter vs best bucketed), "
        f"overlap gain: {overlap}"
    )


def _ratio(value: float, missing: str) -> str:
    return missing if math.isnan(value) else f"{value:.1f}x"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None or math.isnan(value) else format(value, fmt)


_CONSOLE_COLUMNS = (
    ("allreduce/step", 15),
    ("samples/step", 14),
    ("median step ms", 16),
    ("exposed comm ms", 17),
    ("comm ms/sample", 16),
    ("speedup vs per-param", 22),
)


def _cells(r: Row) -> list[str]:
    speedup = _num(r.speedup_vs_per_parameter, ".1f")
    return [
        str(r.calls),
        str(r.samples or "-"),
        f"{r.median_step_ms:.1f}",
        _num(r.exposed_comm_ms, ".1f"),
        _num(r.comm_ms_per_sample, ".2f"),
        speedup + ("x" if speedup != "-" else ""),
    ]


def format_table(
    rows: list[Row],
    rate_mbit: float | None = None,
    backward_ms: float = 0.0,
    intros: Mapping[tuple[float, str], str] | None = None,
) -> str:
    """The console table, one block per latency value and phase; ``intros`` (by delay and
    phase key) leads a phase's block with its link, workload and what it shows."""
    rate = f", rate {rate_mbit:g} Mbit/s" if rate_mbit else ""
    if backward_ms:
        rate += f", simulated backward compute {backward_ms:g} ms/step"
    width = max([28, *(len(r.config) + 2 for r in rows)])
    header = f"{'configuration':<{width}}" + "".join(f"{h:>{w}}" for h, w in _CONSOLE_COLUMNS)
    lines = []
    for block in dict.fromkeys((r.ms, r.phase) for r in rows):
        intro = (intros or {}).get(block)
        lines += [intro or f"link delay {block[0]:g} ms one-way{rate}:", header + "  parity"]
        for r in (r for r in rows if (r.ms, r.phase) == block):
            cells = "".join(
                f"{c:>{w}}" for c, (_, w) in zip(_cells(r), _CONSOLE_COLUMNS, strict=True)
            )
            lines.append(f"{r.config:<{width}}{cells}  {r.parity_text}")
    return "\n".join(lines)


def format_timing(t: ConfigTiming) -> str:
    """A block of the console report: the step's phases, then a line per bucket."""
    lines = [
        f"{t.config}: forward {t.forward_ms:.1f} ms, backward {t.backward_ms:.1f} ms, "
        f"step {t.step_ms:.1f} ms (medians of {t.samples} rank-steps)",
        f"  {'bucket':<8}{'compute ms':>11}{'launch ms':>11}{'allreduce ms':>14}"
        f"{'done after backward ms':>24}",
    ]
    for b in t.buckets:
        lines.append(
            f"  {'b' + str(b.bucket):<8}{_num(b.compute_ms, '.1f'):>11}{b.launch_ms:>11.1f}"
            f"{b.comm_ms:>14.1f}{b.after_backward_ms:>24.1f}"
        )
    return "\n".join(lines)


def change_lines(runs: Sequence[ConfigRun]) -> list[str]:
    """With ``--change-at-step``: per configuration, the steps around the change in every
    round (the step it took effect at, the medians before and after, the steps to recover;
    :mod:`lab.experiments.link_change` defines them)."""
    changed = [r for r in runs if r.change is not None and r.recovery is not None]
    if not changed:
        return []
    first = changed[0].change
    assert first is not None
    to = f"{first.to_ms:g} ms" + (f", {first.to_rate_mbit:g} Mbit/s" if first.to_rate_mbit else "")
    lines = [
        f"link change to {to} at step {first.asked_step} (steps to recover: from the first "
        "step on the new link until every step stays within 10% of the median of the last 5):"
    ]
    for run in changed:
        rec = run.recovery
        assert rec is not None and run.change is not None
        off = "; probe NOT as asked" if run.change.mismatch else ""
        recover = "never settled" if rec.steps_to_recover is None else rec.steps_to_recover
        lines.append(
            f"  {run.job}: in place from step {rec.effective_step}, median before "
            f"{_num(rec.before_ms, '.1f')} ms, after {_num(rec.after_ms, '.1f')} ms, steps to "
            f"recover {recover}{off}"
        )
    return lines


def closing(summary: LatencySummary) -> Closing:
    """The table and the Gantt pair's bucket timings, then (after the 'took' line and what
    broke) overlap per cap, the auto cap's choice, accumulation's drop and the headline of
    every delay (the last line)."""
    plan, rows, gantt = summary.result.plan, summary.rows, summary.gantt
    intros = {(p.ms, p.key): p.intro for p in plan.phases() if p.key}
    before = [format_table(rows, plan.rate_mbit, plan.train.backward_delay_ms, intros)]
    if gantt.timings:
        before.append(f"per bucket, round 1 at {gantt.ms:g} ms (the Gantt chart's pair):")
        before += [format_timing(timing) for timing in gantt.timings]
    before += change_lines(summary.result.runs)
    after = []
    for h in summary.headlines:
        after += [overlap_by_cap_line(rows, h.ms), *auto_cap_lines(rows, h.ms)]
        after += [line for line in [accumulation_line(rows, h.ms)] if line]
    return Closing(before, after + [headline_line(h) for h in summary.headlines])


# The files of a sweep in ``runs/<run-id>/``, from its summary: ``latency.csv`` (the table),
# ``latency.json`` (with the definitions, the links, every run, the per-bucket timings),
# ``latency.png`` (step time vs bucket cap), and at the largest delay ``trace.json`` (every
# allreduce configuration's representative step) and ``gantt.png`` (the timeline cap, overlap
# on vs off).


def _plot_caps(rows: list[Row]) -> list[float | str]:
    """Fixed caps in order, then "auto" if it ran."""
    fixed = sorted({r.cap_mb for r in rows if isinstance(r.cap_mb, int | float)})
    return [*fixed, *(["auto"] if any(r.is_auto for r in rows) else [])]


def _cap_label(cap: float | str, calls: int | None) -> str:
    name = "auto" if cap == "auto" else "per-param" if cap == 0 else f"{cap:g} MB"
    return name if calls is None else f"{name}\n({count(calls, 'call')})"


def _line_label(ms: float, phase: str, overlap: bool) -> str:
    return f"{ms:g} ms{f', {phase}-bound' if phase else ''}, overlap {'on' if overlap else 'off'}"


def plot_sweep(path: Path, rows: list[Row]) -> None:
    """Median step time vs bucket cap: overlap on (solid) and off (dashed), one colour per
    latency value and phase, the no-sync floor dotted, the auto cap at the right end of its
    line. Caps sit at even spacing (cap 0 has no log). Accumulation rows are left out: their
    steps hold K times the samples. Matplotlib's Agg backend, no display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.accumulate == 1]
    caps = _plot_caps([r for r in rows if not r.is_floor])
    x = {cap: i for i, cap in enumerate(caps)}
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for i, (ms, phase) in enumerate(dict.fromkeys((r.ms, r.phase) for r in rows)):
        color = f"C{i}"
        block = [r for r in rows if (r.ms, r.phase) == (ms, phase)]
        for overlap, style in ((True, "-o"), (False, "--s")):
            pts = sorted((x[r.cap_mb], r.median_step_ms) for r in block if r.overlap is overlap)
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, style, color=color, label=_line_label(ms, phase, overlap))
        floor = next((r for r in block if r.is_floor), None)
        if floor is not None:
            ax.axhline(floor.median_step_ms, color=color, linestyle=":", linewidth=1)
            ax.annotate(
                f"no-sync floor {floor.median_step_ms:.1f} ms",
                (len(caps) - 1, floor.median_step_ms),
                textcoords="offset points",
                xytext=(0, 4),
                ha="right",
                fontsize=8,
                color=color,
            )
    calls = {r.cap_mb: r.calls for r in rows if not r.is_floor and not r.is_auto}
    ax.set_xticks(range(len(caps)), [_cap_label(c, calls.get(c)) for c in caps])
    ax.set_yscale("log")
    ax.set_xlabel("bucket cap (allreduce calls per step)")
    ax.set_ylabel("median step time (ms, log scale)")
    ax.set_title("Step time vs bucket cap under injected link latency")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_csv(path: Path, rows: list[Row]) -> None:
    table(rows).write_csv(path)


def _jsonable(value: object) -> object:
    # NaN is not JSON; null says "not measured" honestly.
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))  # e.g. a Row, a link's report
    return value


def write_json(path: Path, rows: list[Row], headlines: list[Headline], extra: dict) -> None:
    """``extra`` carries the run's plan, link measurements and file names."""
    doc = {
        **extra,
        "definitions": DEFINITIONS,
        "rows": [dataclasses.asdict(r) for r in rows],
        "headline": [dataclasses.asdict(h) for h in headlines],
    }
    path.write_text(json.dumps(_jsonable(doc), indent=2) + "\n")


def _phases(summary: LatencySummary) -> list[dict]:
    return [
        {
            "key": p.key,
            "title": p.title,
            "ms": p.ms,
            "rate_mbit": p.rate_mbit,
            "lesson": p.lesson,
            "train": p.train.to_dict(),
            "configurations": [c.label for c in p.configurations],
        }
        for p in summary.result.plan.phases()
    ]


def write_files(summary: LatencySummary) -> list[Path]:
    """Every file of the sweep; the paths written."""
    result, rows, gantt = summary.result, summary.rows, summary.gantt
    plan, run_dir = result.plan, result.run_dir
    files = [run_dir / "latency.csv", run_dir / "latency.png"]
    write_csv(files[0], rows)
    plot_sweep(files[1], rows)
    if gantt.traced:
        files.append(run_dir / "trace.json")
        files[-1].write_text(json.dumps(timeline.chrome_trace(gantt.traced)))
        files.append(run_dir / "gantt.png")
        suptitle = f"one step at {gantt.ms:g} ms link delay, {plan.nodes} ranks"
        timeline.write_gantt(files[-1], gantt.pair, suptitle=suptitle)
    files.append(run_dir / "latency.json")
    extra = {
        "run_id": result.run_id,
        "settings": plan_settings(plan, skip=("train",), train=plan.train),
        "phases": _phases(summary),
        "links": [dataclasses.asdict(lk) for lk in result.links],
        "timeline": {
            "ms": gantt.ms,
            "cap_mb": gantt.cap_mb,
            "phase": gantt.phase,
            "steps": gantt.steps,
        },
        "bucket_timings": gantt.timings,
        "runs": [
            {
                "name": run.job,
                "phase": run.phase_key,
                "seconds": round(run.seconds, 1),
                "exit_codes": run.codes,
                "median_step_ms": run.stats.median_step_ms,
            }
            for run in result.runs
        ],
        "seconds": round(result.seconds, 1),
        "files": [f.name for f in files],
    }
    write_json(files[-1], rows, summary.headlines, extra)
    return files


# The page: bucketing and overlap as the headline, the sweep's table, the per-bucket timings
# of the Gantt chart's pair, the figures, the verified links and every rank's exit.

_FILES = [
    ("latency.csv", "the table, one row per delay and configuration"),
    ("latency.json", "settings, definitions, links, every run"),
    ("trace.json", "Chrome trace of every configuration's representative step"),
]


def _figure(headlines: list[Headline]) -> str:
    several = len(headlines) > 1
    return "; ".join(
        f"bucketing {ratio_text(h.bucketing_speedup)}, overlap {ratio_text(h.overlap_gain)}"
        + (f" at {h.ms:g} ms" if several else "")
        for h in headlines
    )


def _timings(timings: list[ConfigTiming]) -> list[PageTable]:
    tables = []
    for t in timings:
        rows = [
            [b.bucket, b.compute_ms, b.launch_ms, b.comm_ms, b.after_backward_ms] for b in t.buckets
        ]
        caption = (
            f"{t.config}: forward {t.forward_ms:.1f} ms, backward {t.backward_ms:.1f} ms,"
            f" step {t.step_ms:.1f} ms (medians over {t.samples} rank-steps)"
        )
        tables.append(
            PageTable(
                ("bucket", "compute ms", "launch ms", "allreduce ms", "after backward ms"),
                rows,
                caption,
            )
        )
    return tables


def _links(links: list[LinkReport]) -> PageTable:
    rows = [
        [lk.ms, lk.shaper, lk.rtt_p50_ms, lk.rtt_p90_ms, lk.baseline_p50_ms, lk.line]
        for lk in links
    ]
    return PageTable(
        ("delay ms", "shaper", "rtt p50 ms", "rtt p90 ms", "unshaped p50 ms", "probe"), rows
    )


def page(summary: LatencySummary) -> Results:
    """The page and the run's summary.json fields."""
    result = summary.result
    lines = [overlap_by_cap_line(summary.rows, h.ms) for h in summary.headlines]
    lines += [headline_line(h) for h in summary.headlines]
    sections = [
        Section("Step time per configuration", [table(summary.rows).page(), Text(lines)]),
        Section("Per bucket (the Gantt chart's pair, round 1)", _timings(summary.gantt.timings)),
        figures_section(
            result.run_dir,
            [
                ("latency.png", "median step time vs bucket cap"),
                ("gantt.png", "one step, overlap on vs off"),
            ],
        ),
        Section("Links, as the probe measured them", [_links(result.links)]),
    ]
    held = "parity holds in every allreduce configuration"
    headline = (summary.broken, held, _figure(summary.headlines))
    # a two-phase run has a floor in each phase: the phase keeps the keys apart
    configs = {
        ", ".join(filter(None, (f"{r.ms:g} ms", r.phase, r.config))): r.median_step_ms
        for r in summary.rows
    }
    ranks = {run.job: run.codes for run in result.runs}
    return sweep_results("latency", result, sections, ranks, headline, configs, _FILES)


# The command: its flags, the plan from them, and the report.

NAME = "latency"
HELP = "inject link latency between containers; sweep bucket caps and overlap"
DESCRIPTION = (
    "Real delayed packets between containers (netem, or an NFQUEUE delayer where the "
    "kernel has no netem), verified by a TCP probe, then per-parameter allreduce vs bucket "
    "caps, each with overlap on and off, plus a no-sync floor."
)


# the terms of the closing line that the epilog defines
_TERMS = ("bucketing speedup", "overlap gain", "exposed communication", "comm ms/sample")

EPILOG = "\n".join(
    [
        textwrap.fill(WORKLOAD, width=92),
        "",
        "The closing line is",
        "  bucketing speedup at <ms> ms: X.Xx (per-parameter vs best bucketed), overlap gain: Y.Yx",
        "and just before it, where they ran, the auto cap's and accumulation's lines:",
        "  auto cap at <ms> ms[, <phase> phase]: chose C MB (round 1), ..., N allreduces/step, ...",
        "  accumulation at <ms> ms: communication per sample Z.Zx lower with accumulate K (...)",
        "where",
        *common.definitions({t: DEFINITIONS[t] for t in _TERMS}),
        "Files in runs/<run-id>/: latency.csv, latency.json, latency.png (step time vs bucket",
        "cap), trace.json (Chrome trace: open in https://ui.perfetto.dev or chrome://tracing),",
        "gantt.png (one step, overlap on vs off), and per configuration and round a job",
        "directory <delay>-<configuration>-r<round>/ with logs/rank<R>.jsonl and node<N>.log.",
        "Exit codes: 0 parity held in every allreduce configuration, 1 parity broken or a run",
        "failed, 2 bad arguments, 130 interrupted.",
    ]
)

# The training settings the sweep leaves to the user; it varies cap, overlap and sync itself.
_TRAIN_FIELDS = ["model", "steps", "batch_size", "seed"]
_ROUNDS = 2
_OVERLAPS = {"both": (True, False), "on": (True,), "off": (False,)}
_BACKWARD = next(f for f in dataclasses.fields(TrainConfig) if f.name == "backward_delay_ms")


def _add_sweep_arguments(p: argparse.ArgumentParser) -> None:
    """What a single-phase sweep runs on its link: the caps, and overlap on, off or both."""
    p.add_argument(
        "--caps",
        type=common.cap_list,
        default=DEFAULT_CAPS,
        help="bucket caps in MB, comma-separated; 0 = per parameter, auto = the wrapper times "
        "the link and picks its own (default "
        f"{','.join(f'{c:g}' for c in DEFAULT_CAPS)})",
    )
    p.add_argument(
        "--overlap",
        choices=_OVERLAPS,
        default="both",
        help="which overlap settings each cap of a single-phase sweep runs with (default both)",
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ms",
        type=common.number(0),
        action="append",
        help="one-way delay per packet in ms (round trip +2x); repeat for several "
        "(default 5; 0 = unshaped)",
    )
    common.add_shaper(p)
    p.add_argument(
        "--rate-mbit",
        type=common.number(0),
        default=DEFAULT_RATE_MBIT,
        help="also limit each node's rate (tbf), so that communication is bandwidth-bound and "
        "serial, which is when overlap pays; 0 = no limit (default %(default)g)",
    )
    p.add_argument(
        "--node-ms",
        type=common.node_value,
        action="append",
        metavar="NODE:MS",
        help="this node's one-way delay instead of --ms (an asymmetric link, e.g. one slow "
        "node: 2:20); repeat for several",
    )
    common.add_impairments(p)
    add_change_flags(p)
    _add_sweep_arguments(p)
    common.add_warmup(p, 2, " (gloo connection set-up)")
    common.add_rounds(
        p,
        "run the whole plan this often, interleaved, and pool the steps: drift of the "
        f"host's load then hits every configuration alike (default {_ROUNDS})",
        _ROUNDS,
    )
    p.add_argument(
        "--backward-ms",
        dest="backward_delay_ms",
        type=common.number(0),
        default=0.0,
        metavar="MS",
        help="a model of accelerator compute, added to the real CPU compute: "
        f"{_BACKWARD.metadata['help']} (ddp train's {flag_of('backward_delay_ms')}; default 0)",
    )
    common.add_nodes(p, DEFAULT_NODES, ": a core per rank on a 2-core host")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"a first look: {QUICK['rounds']} round of {QUICK['steps']} steps (where --rounds "
        "and --steps are not given); both phases of the default, or with explicit settings caps "
        f"{','.join(f'{c:g}' for c in QUICK['caps'])} where --caps is not given",
    )
    common.add_cpus(p, "every node's CPU limit in cores (default: none)")
    p.add_argument(
        "--timeline-cap",
        type=common.number(0),
        help="cap (MB) of the Gantt chart (default: the fastest bucketed cap with overlap on)",
    )
    common.add_job_flags(p, _TRAIN_FIELDS, TRAIN_DEFAULTS, "one configuration (one round of it)")


def _phased(args: argparse.Namespace, train: TrainConfig) -> bool:
    """The default's two phases, unless a setting of the link or workload was given (the
    values left at their defaults: a single-phase sweep of every cap, overlap on and off)."""
    workload = (train.model, train.batch_size, train.backward_delay_ms)
    return (
        args.caps == DEFAULT_CAPS
        and args.rate_mbit == DEFAULT_RATE_MBIT
        and args.timeline_cap is None
        and args.overlap == "both"
        and workload == (TRAIN_DEFAULTS.model, TRAIN_DEFAULTS.batch_size, 0.0)
    )


def plan(args: argparse.Namespace) -> LatencyPlan:
    fields = [*_TRAIN_FIELDS, "backward_delay_ms", "collective_timeout_s"]
    train = config_from_args(args, fields, TRAIN_DEFAULTS)
    phased = _phased(args, train)
    if args.quick:  # only what was left at its default
        if not phased:
            args.caps = QUICK["caps"] if args.caps == DEFAULT_CAPS else args.caps
        args.rounds = QUICK["rounds"] if args.rounds == _ROUNDS else args.rounds
        if train.steps == TRAIN_DEFAULTS.steps:
            train = train.replace(steps=QUICK["steps"])
    return LatencyPlan(
        ms=tuple(args.ms) if args.ms else (5.0,),
        shaper=args.shaper,
        rate_mbit=args.rate_mbit or None,
        caps=tuple(args.caps),
        warmup=args.warmup,
        rounds=args.rounds,
        nodes=args.nodes,
        train=train,
        timeline_cap=args.timeline_cap,
        **common.run_fields(args),
        impair=common.impairments(args),
        node_ms=tuple(args.node_ms or ()),
        cpus=args.cpus,
        phased=phased,
        overlaps=_OVERLAPS[args.overlap],
        change=ChangePlan.from_args(args),
    )


def report(result: SweepResult) -> int:
    """Exit 0 when parity held in every allreduce configuration, else 1."""
    return report_sweep(
        result,
        analyse,
        files=write_files,
        console=closing,
        page=page,
        name=NAME,
        took="sweep took",
    )
