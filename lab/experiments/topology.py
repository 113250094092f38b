"""``python -m lab topology``: ranks on several nodes, a slow link between the nodes and
loopback within; torch's DDP as its users run it against ours, and the limit beside them.

One cluster per layout (``--layouts 2x2,4x2``, or ``--nodes`` x ``--ranks-per-node``), ranks of
a node in one container; every container's eth0 delayed (and optionally capped), verified by
the probe, which is exactly the link between nodes since ranks of one node talk over loopback.
The configurations train the same job in interleaved rounds, steps pooled: the limit (torch's
DDP on the bare link, the link cleared for it and shaped again after), torch's DDP at its
defaults, ours on gloo's flat ring, ours with the hierarchical hook (fp32, and fp16 on the
cross-node leg), ours with ``comm auto``. With ``--change-at-step`` the link changes during
every job but the limit's.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import json
import math
import os
import re
import statistics
import textwrap
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from ddp.torchfree import RankLog, Section, Table, TrainConfig, config_from_args, load_run
from lab import args as common
from lab.args import check_finite, check_timeouts, check_warmup
from lab.engine.cluster import Cluster
from lab.engine.layout import Layout
from lab.engine.specs import DEFAULT_IMAGE
from lab.experiments.changed_job import ChangeTrigger, recheck
from lab.experiments.followed import train_for_parity
from lab.experiments.link_change import (
    RECOVER_LAST,
    RECOVER_WITHIN,
    ChangePlan,
    LinkChange,
    Recovery,
    StepPoint,
    add_change_flags,
    link_text,
    recovery,
    step_points,
)
from lab.experiments.sweep import lifetime, sweep_cluster
from lab.measure.counters import Sample, Window, parse_samples, sampled, window_bytes
from lab.measure.job_figures import job_figures
from lab.report.common import figures_section
from lab.report.report import Closing, SweepResult
from lab.report.report import report as report_sweep
from lab.report.results import Results, sweep_results
from lab.shaping.changing import ChangingLink
from lab.shaping.registry import CHOICES
from lab.shaping.verified_link import verified_link

__all__ = [
    "AUTO_CAP",
    "BASELINE",
    "CONFIGURATIONS",
    "DEFINITIONS",
    "HEADLINE_ORDER",
    "LESSONS",
    "LIMIT",
    "QUICK",
    "TRAIN_DEFAULTS",
    "TWO_LEVEL",
    "ConfigRun",
    "Configuration",
    "JobFigures",
    "LayoutRows",
    "LinkInfo",
    "Planned",
    "Row",
    "TopologyPlan",
    "TopologyResult",
    "TopologySummary",
    "add_arguments",
    "analyse",
    "auto_cap_line",
    "between_nodes",
    "change_line",
    "closing",
    "combine_rounds",
    "cores_line",
    "derive_rows",
    "format_table",
    "headline_line",
    "job",
    "make_row",
    "page",
    "parse_layouts",
    "plan",
    "plans_line",
    "plot_step_times",
    "report",
    "run",
    "write_files",
]


# ------------------------------------------------------------------------------------------
# ``lab topology``'s plan: the layouts (nodes x ranks per node), the link between the nodes,
# a change of it during the jobs, and the configurations trained on it, validated before any
# container exists.
#
# Every configuration is a ``TrainConfig`` variant of one base config (same model, seed, data,
# steps, bucket cap): torch's DDP as its users run it (25 MB cap, gloo's flat ring), ours on the
# flat ring, ours with the hierarchical hook (fp32, and with an fp16 cross-node leg), ours with
# ``comm="auto"`` (bucket cap and algorithm chosen together from what it measured), and the limit:
# torch's DDP on the bare link, which no algorithm can beat. Ranks of one node share its
# container and talk over loopback, so shaping each container's eth0 is exactly the link between
# nodes. Each round runs the limit first (the link cleared), then every other configuration,
# torch's first, so a drift of the shared host's load hits all alike. Pure: tested without
# Docker.


@dataclass(frozen=True)
class Configuration:
    """One way to train: ``name`` (file-safe, the job's directory), ``label`` (the headline's
    word for it), the ``TrainConfig`` fields it sets on the base config, and whether it runs on
    the bare link (``unshaped``: the limit)."""

    name: str
    label: str
    fields: tuple[tuple[str, Any], ...]
    unshaped: bool = False

    def train_config(self, base: TrainConfig) -> TrainConfig:
        return base.replace(**dict(self.fields))


LIMIT = Configuration("limit", "limit", (("wrapper", "torch"),), unshaped=True)
BASELINE = Configuration("torch", "torch DDP", (("wrapper", "torch"),))
# comm auto owns the cap: it runs from TrainConfig's own (torch's 25 MB) whatever the others'
_AUTO = Configuration("auto", "comm auto", (("comm", "auto"), ("bucket_cap_mb", 25.0)))
CONFIGURATIONS = (
    BASELINE,
    Configuration("flat", "flat", ()),
    Configuration("hierarchical", "hierarchical", (("comm_hook", "hierarchical"),)),
    Configuration("hierarchical-fp16", "hierarchical-fp16", (("comm_hook", "hierarchical-fp16"),)),
    _AUTO,
)
TWO_LEVEL = ("hierarchical", "hierarchical-fp16")  # with one rank per node: the flat ring
# the wrapper's auto bucket cap alone (on the flat ring): run beside --caps, which judge it
AUTO_CAP = Configuration("auto-cap", "auto cap", (("bucket_cap_mb", "auto"),))

# The lesson variants: the same rows with every cap set for what the lesson shows.
LESSONS = {"per-tensor": 0.0}  # one allreduce per tensor: what a two-level allreduce pays most

# torch's DDP as its users run it: a 25 MB bucket cap (one bucket of the deep MLP's 2.67 MB),
# the cap of every row but comm auto, which chooses its own. The deep MLP (24 tensors, a few
# ms of forward+backward per rank at a local batch of 16) keeps compute small beside the 5 ms
# link. 12 steps: wall time is mostly the ranks' start (importing torch, four ranks on two
# cores), so more rounds buy more than more steps.
TRAIN_DEFAULTS = TrainConfig(
    model="deep", steps=12, batch_size=64, seed=0, bucket_cap_mb=25.0, collective_timeout_s=60.0
)


# --quick: one round of fewer steps (each only where its flag was not given): a few minutes
QUICK = {"steps": 8, "rounds": 1}

_LAYOUT = re.compile(r"^(\d+)x(\d+)$")


def parse_layouts(text: str) -> tuple[Layout, ...]:
    """``"2x2,4x2"`` -> two layouts (nodes x ranks per node); ValueError saying
    which part is wrong."""
    layouts = []
    for part in text.split(","):
        m = _LAYOUT.match(part.strip())
        if not m or int(m.group(1)) < 2 or int(m.group(2)) < 1:
            raise ValueError(
                f"--layouts {text}: {part.strip()!r} is not a layout; give NODESxRANKS with "
                "NODES >= 2 and RANKS >= 1, comma-separated, e.g. 2x2,4x2,2x4,8x1"
            )
        layouts.append(Layout(int(m.group(1)), int(m.group(2))))
    if len(set(layouts)) != len(layouts):
        raise ValueError(f"--layouts {text} repeats a layout; give each once")
    return tuple(layouts)


class Planned(NamedTuple):
    """One job of the plan, in run order; ``job`` names its directory, ``runs/<run-id>/<job>/``
    (``<layout>-<configuration>-r<round>``)."""

    job: str
    round: int
    conf: Configuration
    train: TrainConfig
    layout: Layout


@dataclass(frozen=True)
class TopologyPlan:
    """What ``python -m lab topology`` measures, and its bounds."""

    layouts: tuple[Layout, ...] = (Layout(2, 2),)
    ms: float = 5.0  # one-way delay between nodes; none within a node (loopback)
    rate_mbit: float | None = None  # a rate cap on each node's link (None: no cap)
    shaper: str = "auto"
    rounds: int = 2
    warmup: int = 3  # gloo's set-up, the bucket rebuild, the automatic setting's measurements
    train: TrainConfig = field(default_factory=lambda: TRAIN_DEFAULTS)
    # the run's bounds and where it writes
    image: str = DEFAULT_IMAGE
    run_timeout_s: float = 300.0  # wall time of one job
    progress: bool = True
    runs_dir: Path = Path("runs")
    quick: bool = False
    # extra rows: ours flat at these caps (MB), and the auto cap judged against them
    caps: tuple[float, ...] = ()
    lesson: str = ""  # "" (torch's defaults) or a key of LESSONS: every row at its cap
    change: ChangePlan | None = None  # the link changes during every job but the limit

    def __post_init__(self) -> None:
        if not self.layouts or not all(isinstance(lay, Layout) for lay in self.layouts):
            raise ValueError(f"give at least one layout, e.g. --layouts 2x2; got {self.layouts!r}")
        for lay in self.layouts:
            if lay.nodes < 2:
                raise ValueError(
                    f"--nodes must be an integer >= 2 (a link needs two ends), got {lay.nodes!r}"
                )
        if len(set(self.layouts)) != len(self.layouts):
            raise ValueError("--layouts repeats a layout; give each once")
        check_finite("--ms", self.ms, 0.0)
        if self.rate_mbit is not None and not (
            math.isfinite(self.rate_mbit) and self.rate_mbit > 0
        ):
            raise ValueError(f"--rate-mbit must be a finite number > 0, got {self.rate_mbit!r}")
        if self.ms == 0 and self.rate_mbit is None and self.change is None:
            raise ValueError(
                "--ms 0 without --rate-mbit shapes nothing: the nodes' link would "
                "be as fast as the bridge; give a delay or a rate (or --change-at-step)"
            )
        if self.shaper not in CHOICES:
            raise ValueError(f"--shaper must be one of {', '.join(CHOICES)}, got {self.shaper!r}")
        check_warmup(self.warmup, self.train.steps)
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 1:
            raise ValueError(f"--rounds must be an integer >= 1, got {self.rounds!r}")
        base = self.train
        if base.bucket_cap_mb == "auto":
            raise ValueError(
                "--bucket-cap-mb auto: the automatic rows choose their own cap; "
                "give the number every other configuration uses"
            )
        if (base.wrapper, base.comm_hook, base.sync) != ("ours", "none", "allreduce"):
            raise ValueError(
                "the base training config must be ours, a plain allreduce, no hook: "
                "the configurations set wrapper and comm_hook themselves"
            )
        if self.lesson and self.lesson not in LESSONS:
            raise ValueError(f"--lesson must be one of {', '.join(LESSONS)}, got {self.lesson!r}")
        if self.lesson and base.bucket_cap_mb != LESSONS[self.lesson]:
            raise ValueError(
                f"--lesson {self.lesson} runs every row at --bucket-cap-mb "
                f"{LESSONS[self.lesson]:g}, got --bucket-cap-mb {base.bucket_cap_mb:g}; "
                "give one of the two"
            )
        for cap in self.caps:
            check_finite("--caps", cap, 0.0)
        if len(set(self.caps)) != len(self.caps) or base.bucket_cap_mb in self.caps:
            raise ValueError(
                f"--caps {','.join(f'{c:g}' for c in self.caps)} repeats a cap "
                f"(the flat row already runs --bucket-cap-mb "
                f"{base.bucket_cap_mb:g}); give each once"
            )
        if self.change is not None:
            self.change.check(base.steps, self.warmup)
        check_timeouts(base.collective_timeout_s, self.run_timeout_s, "job")
        for lay in self.layouts:
            base.local_batch(lay.world_size)  # the global batch must split over the ranks
        self.jobs()  # every configuration's TrainConfig validates

    @property
    def layout(self) -> Layout:
        """The layout with the most nodes (the one a run's hosts must hold); a plan of one
        layout's (:meth:`per_layout`) is that layout."""
        return max(self.layouts, key=lambda lay: (lay.nodes, lay.world_size))

    def per_layout(self) -> list[TopologyPlan]:
        """One plan per layout, in the order given: what one cluster runs."""
        return [dataclasses.replace(self, layouts=(lay,)) for lay in self.layouts]

    def configurations(self, layout: Layout | None = None) -> tuple[Configuration, ...]:
        """The limit, torch's DDP, ours (flat, two levels unless ``layout`` has one rank per
        node, comm auto), then ours flat at every extra cap of ``caps`` and the auto cap."""
        layout = layout or self.layouts[0]
        rows = [
            c for c in CONFIGURATIONS if not (layout.ranks_per_node == 1 and c.name in TWO_LEVEL)
        ]
        extra = tuple(
            Configuration(f"cap{cap:g}", f"flat cap {cap:g} MB", (("bucket_cap_mb", cap),))
            for cap in self.caps
        )
        return (LIMIT, *rows, *extra, *((AUTO_CAP,) if self.caps else ()))

    def jobs(self, layout: Layout | None = None) -> list[Planned]:
        """Every job of ``layout`` (default: of every layout), layout by layout: every round
        runs every configuration, the limit first, then torch's DDP."""
        layouts = self.layouts if layout is None else (layout,)
        return [
            Planned(f"{lay.name}-{c.name}-r{r}", r, c, c.train_config(self.train), lay)
            for lay in layouts
            for r in range(1, self.rounds + 1)
            for c in self.configurations(lay)
        ]

    @property
    def total(self) -> int:
        return len(self.jobs())

    @property
    def link_text(self) -> str:
        """``5 ms`` or ``5 ms, 100 Mbit/s`` (``unshaped``): the headline's and the table's link,
        and with a change ``5 ms, then 20 ms at step 20``."""
        text = link_text(self.ms, self.rate_mbit)
        if self.change is not None:
            text += f", then {self.change.text}"
        return text

    @property
    def cap_text(self) -> str:
        """The cap every row but the automatic ones runs: ``25 MB cap`` or the lesson's."""
        cap = self.train.bucket_cap_mb
        return f"lesson {self.lesson}: cap {cap:g} MB" if self.lesson else f"{cap:g} MB cap"

    def describe(self) -> str:
        layouts = ", ".join(lay.describe() for lay in self.layouts)
        jobs = len(self.configurations(self.layouts[0]))
        return (
            f"{layouts}, {self.link_text} between nodes, model {self.train.model} "
            f"({self.cap_text}), {jobs} configurations x {self.rounds} round(s) x "
            f"{self.train.steps} steps ({self.warmup} warm-up)"
        )


# ------------------------------------------------------------------------------------------
# The link between the nodes: every node's eth0 delayed (``--ms``) and, with ``--rate-mbit``,
# capped, verified by the probe (:func:`lab.shaping.verified_link.verified_link`) for as long as
# the jobs run. Ranks of one node talk over loopback, which no shaper touches.


@contextlib.contextmanager
def between_nodes(
    cluster: Cluster, plan: TopologyPlan, setting: object, max_seconds: float
) -> Iterator[LinkInfo]:
    """Shape, verify, yield what the probe measured, undo (``setting``: the sweep's only one)."""
    where = "between the nodes"
    kw = {"max_seconds": max_seconds}
    with verified_link(cluster, where, plan.ms, plan.shaper, plan.rate_mbit, **kw) as rep:
        yield LinkInfo.from_report(rep)


# ------------------------------------------------------------------------------------------
# What a run of ``lab topology`` produced, as plain data: every verified link, every job with
# each node's sampled eth0 counters and, where the link changed during it, what the probe said.
# Docker-free, so the report and its tests build on it without the engine.


@dataclass
class LinkInfo:
    """The verified link between the nodes: the probe's line, and its figures as it gave them
    (``probed``: "baseline" and "measured" round trips in ms, "bulk" with ``--rate-mbit``)."""

    shaper: str
    line: str
    note: str = ""
    probed: dict[str, dict[str, float]] = field(default_factory=dict)
    layout: str = ""  # Layout.name of the cluster it was verified on
    what: str = "the link"  # or "after the change, idle" (re-verified after a job)

    @classmethod
    def from_report(cls, rep: Any, layout: str = "", what: str = "the link") -> LinkInfo:
        """From :class:`lab.shaping.link.ShapingReport`."""
        kinds = ("baseline", "measured", "bulk")
        probed = {k: dict(getattr(rep, k)) for k in kinds}
        return cls(rep.shaper, rep.line(), rep.note, probed, layout, what)

    def figure(self, kind: str, key: str) -> float | None:
        """e.g. ``figure("measured", "p50_ms")``; None where the probe did not measure it."""
        return self.probed.get(kind, {}).get(key)


@dataclass
class ConfigRun:
    """One job: a configuration in one round of a layout; how its ranks exited, ddp's
    verdict, every node's eth0 samples (``"<time> <tx> <rx>"`` lines, :mod:`.counters`) and
    the change of its link (None: none during it)."""

    conf: str  # Configuration.name
    round: int
    job: str
    codes: dict[int, int]
    parity: bool
    seconds: float
    counters: dict[int, str] = field(default_factory=dict)
    layout: str = "2x2"  # Layout.name
    change: LinkChange | None = None


@dataclass
class TopologyResult(SweepResult[TopologyPlan, LinkInfo, ConfigRun]):
    """The run: every verified link, every job in run order, layout by layout; ``cpus``: the
    cores of the host the ranks shared."""

    cpus: int | None = None


# ------------------------------------------------------------------------------------------
# ``lab topology``'s run: per layout one cluster (:func:`lab.experiments.sweep.sweep_cluster`,
# the run's one id and folder shared by them all, one after the other), its link held by a
# :class:`lab.shaping.changing.ChangingLink`: cleared for the limit, shaped and verified for the
# others; per job a training job followed through its records, success from the exits and ddp's
# verdict, every node's eth0 counters sampled while it ran (:mod:`.counters`); with a change, the
# link re-shaped at the step (:mod:`lab.experiments.changed_job`) and verified again once idle.

_SAMPLER_SLACK_S = 120.0  # the sampler outlives the job's timeout by this, then ends itself
Echo = Callable[[str], None]


def _say_retries(link: ChangingLink, echo: Echo) -> None:
    """A strict check that passed only on its second attempt says what the first measured."""
    for first in link.retried:
        echo(f"link check passed on a second attempt; the first: {first}")
    link.retried.clear()


def _shape_for(
    link: ChangingLink, plan: TopologyPlan, p: Planned, result: TopologyResult, echo: Echo
) -> None:
    """The link ``p`` runs on: bare for the limit, else the plan's, verified when it changes."""
    if p.conf.unshaped:
        if link.setting != (0.0, None):
            link.clear()
            echo("link cleared: the limit runs on the bare link")
        return
    report = link.ensure(plan.ms, plan.rate_mbit)
    _say_retries(link, echo)
    if report is not None:
        if report.note:
            echo(report.note)
        echo(report.line())
        result.links.append(LinkInfo.from_report(report, p.layout.name))


def _run_job(
    cluster: Cluster,
    plan: TopologyPlan,
    p: Planned,
    link: ChangingLink,
    result: TopologyResult,
    echo: Echo,
) -> ConfigRun:
    started = time.monotonic()
    where = f"{p.conf.label} on {p.layout.name} (round {p.round})"
    slow = "a long --ms or a low --rate-mbit makes steps slow"
    trigger = None
    if plan.change is not None and not p.conf.unshaped:
        trigger = ChangeTrigger(link, plan.change, echo)
    with sampled(cluster, f"eth0-{p.job}", plan.run_timeout_s + _SAMPLER_SLACK_S) as counters:
        job, parity = train_for_parity(
            cluster, p.job, p.train, plan, where=where, slow_hint=slow, echo=echo, on_event=trigger
        )
    if trigger is not None and trigger.fired:
        report = recheck(link, plan.change)
        _say_retries(link, echo)
        if report is not None:
            what = f"after the change, idle (after {p.job})"
            result.links.append(LinkInfo.from_report(report, p.layout.name, what))
            echo(f"  the changed link, idle after the job: {report.line()}")
    return ConfigRun(
        p.conf.name,
        p.round,
        p.job,
        dict(job.codes),
        parity,
        time.monotonic() - started,
        counters,
        p.layout.name,
        trigger.change if trigger is not None and trigger.fired else None,
    )


def _describe(run: ConfigRun, done: int, total: int) -> str:
    return (
        f"[{done:>2}/{total}] {run.layout} round {run.round}  {run.conf:<18} parity "
        f"{'holds' if run.parity else 'BROKEN'}  ({run.seconds:.0f} s)"
    )


def run(plan: TopologyPlan, echo: Echo = print) -> TopologyResult:
    """Per layout: start the nodes, run every job on its link; each cluster collects its logs
    into ``runs_dir/<run-id>/<job>/`` and removes everything, always."""
    result: TopologyResult | None = None
    started = time.monotonic()

    def new_result(_plan: object, run_id: str, run_dir: object) -> TopologyResult:
        nonlocal result
        if result is None:
            result = TopologyResult(plan, run_id, run_dir, cpus=os.cpu_count())
        return result

    def header(r: TopologyResult) -> str:
        if len(r.runs) == 0:
            return f"run {r.run_id}: {plan.describe()}; output in {r.run_dir}/"
        return f"layout {sub.layouts[0].describe()}: a cluster of its own"

    total = plan.total
    for sub in plan.per_layout():
        life = lifetime(len(sub.jobs()), plan.run_timeout_s)
        run_id = result.run_id if result is not None else None
        cluster_run = sweep_cluster(sub, new_result, header, echo, lifetime_s=life, run_id=run_id)
        with cluster_run as (cluster, res), ChangingLink(cluster, plan.shaper, life) as link:
            for p in sub.jobs():
                _shape_for(link, plan, p, res, echo)
                res.runs.append(_run_job(cluster, sub, p, link, res, echo))
                echo(_describe(res.runs[-1], len(res.runs), total))
    assert result is not None
    result.seconds = time.monotonic() - started
    return result


# ------------------------------------------------------------------------------------------
# ``lab topology``'s figures from the rank logs (``ddp.torchfree.RankLog``) and the sampled
# eth0 counters: per layout one row per configuration, pooled over its rounds, compared with
# torch's DDP and with the limit (its network cost); with a link change, each row's steps before
# and after it and how many it took to recover (:func:`lab.experiments.link_change.recovery`).
# :func:`analyse` turns a run's result into the one :class:`TopologySummary` the files, the
# console text and the page are built from. Pure but for reading the collected logs: tested from
# synthetic logs and samples.

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


# ------------------------------------------------------------------------------------------
# ``topology.png``: per layout, the median step time of every configuration, each round's
# median as a dot beside it, torch's DDP as the dashed reference and the limit as the dotted
# floor. Pure (matplotlib's Agg backend).


def plot_step_times(path: Path, layouts: Sequence[LayoutRows], title: str) -> None:
    """One panel per layout. Bars: median step time per configuration (its ratio to torch's
    above it); dots: the rounds' own medians, which show how far the host's load moved the
    figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(1, len(layouts))
    fig, axes = plt.subplots(n, 1, figsize=(9, 4.2 * n), dpi=110, squeeze=False)
    for ax, table in zip(axes[:, 0], layouts, strict=False):
        rows = table.rows
        xs = range(len(rows))
        bars = ax.bar(xs, [r.median_step_ms for r in rows], color=[f"C{i}" for i in xs])
        for x, r, bar in zip(xs, rows, bars, strict=True):
            ax.plot([x] * len(r.round_step_ms), r.round_step_ms, "k.", markersize=6)
            if not math.isnan(r.step_time_vs_torch):
                ax.annotate(
                    f"{r.step_time_vs_torch:.2f}x",
                    (x, bar.get_height()),
                    ha="center",
                    textcoords="offset points",
                    xytext=(0, 4),
                    fontsize=9,
                )
        for name, style in ((BASELINE.name, "--"), (LIMIT.name, ":")):
            row = table.row(name)
            if row is not None:
                ax.axhline(row.median_step_ms, color="black", linestyle=style, linewidth=0.8)
        ax.set_xticks(list(xs), [r.label for r in rows], fontsize=8)
        ax.set_ylabel("median step ms; dots: rounds")
        ax.set_title(f"{table.title}: step time vs torch DDP (ratio above each bar)", fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ------------------------------------------------------------------------------------------
# What ``lab topology`` prints, from the run's summary: a table per layout (with the limit, each
# row's network cost and, with a link change, its steps to recover), comm auto's plans, the note
# on the shared cores and, last, one line per layout that a script can read. Pure.

HEADLINE_ORDER = ("auto", "hierarchical", "hierarchical-fp16", "flat")  # Configuration names


def _num(value: float | None, fmt: str, suffix: str = "") -> str:
    return "-" if value is None or math.isnan(value) else format(value, fmt) + suffix


def _link_text(links: Sequence[LinkInfo], layout: str) -> str:
    mine = [lk for lk in links if lk.layout == layout and lk.what == "the link"]
    rtt = mine[0].figure("measured", "p50_ms") if mine else None
    if rtt is None:
        return "the bare link (nothing to probe)"
    base, bulk = mine[0].figure("baseline", "p50_ms"), mine[0].figure("bulk", "mbit_s")
    rate = "" if bulk is None else f", bulk {bulk:.1f} Mbit/s"
    return f"probe: round trip p50 {rtt:.2f} ms (unshaped {_num(base, '.2f')} ms){rate}"


_COLUMNS = (
    ("step ms", 9),
    ("per round", 13),
    ("network ms", 12),
    ("net vs torch", 14),
    ("vs torch", 10),
    ("vs limit", 10),
    ("cross-node MB/step", 20),
    ("buckets", 9),
    ("max|dparam|", 13),
)
_CHANGE_COLUMNS = (("before ms", 11), ("after ms", 10), ("recover", 9))


def _recover(row: Row) -> str:
    return "/".join("-" if n is None else str(n) for n in row.steps_to_recover) or "-"


def _cells(r: Row, change: bool) -> list[str]:
    cells = [
        f"{r.median_step_ms:.1f}",
        "/".join(f"{m:.0f}" for m in r.round_step_ms),
        _num(r.network_ms, ".1f"),
        _num(r.network_vs_torch, ".2f"),
        _num(r.step_time_vs_torch, ".2f", "x"),
        _num(r.step_time_vs_limit, ".2f", "x"),
        _num(r.cross_mb_per_step, ".2f"),
        _num(r.buckets, "d"),
        _num(r.max_param_diff, ".1e"),
    ]
    if change:
        cells += [_num(r.before_ms, ".1f"), _num(r.after_ms, ".1f"), _recover(r)]
    return cells


def format_table(table: LayoutRows, plan: TopologyPlan, links: Sequence[LinkInfo]) -> str:
    """A header with the layout, the link and the cap, then one line per configuration."""
    rows = table.rows
    steps = max((r.steps_measured for r in rows), default=0)
    change = plan.change is not None
    columns = _COLUMNS + (_CHANGE_COLUMNS if change else ())
    lines = [
        f"{table.title}, {plan.link_text} one-way between nodes (none within: loopback), model "
        f"{plan.train.model}, {plan.cap_text}; {steps} measured steps over {plan.rounds} "
        f"round(s); {_link_text(links, table.layout)}",
        f"{'configuration':<31}" + "".join(f"{h:>{w}}" for h, w in columns) + "  parity",
    ]
    for r in rows:
        cells = "".join(f"{c:>{w}}" for c, (_, w) in zip(_cells(r, change), columns, strict=True))
        lines.append(f"{r.title:<31}{cells}  {'holds' if r.parity else 'BROKEN'}")
    return "\n".join(lines)


def _plan_text(p: dict) -> str:
    cap = p.get("cap_mb")
    cap_text = f"{cap:g} MB" if isinstance(cap, int | float) else str(cap)
    predicted, measured = p.get("predicted_ms"), p.get("measured_ms")
    figures = f"predicted {_num(predicted, '.1f')} ms"
    if measured is not None:
        figures += f", measured {_num(measured, '.1f')} ms"
    # the reason's first clause here; all of it in topology.json
    reason = f" ({str(p['reason']).split('; ')[0]})" if p.get("reason") else ""
    return f"step {p.get('step')}: {cap_text} {p.get('algorithm')}, {figures}{reason}"


def plans_line(table: LayoutRows) -> str:
    """comm auto's plans, as rank 0 recorded them in the last round, each reason's first
    clause ('' when none)."""
    auto = table.row("auto")
    if auto is None or not auto.plans:
        return ""
    return f"comm auto's plans ({table.layout}, rank 0, last round): " + "; ".join(
        _plan_text(p) for p in auto.plans
    )


def _effective(table: LayoutRows) -> str:
    steps = sorted(
        {rec.effective_step for r in table.rows for rec in r.recoveries if rec.effective_step}
    )
    return f"in place from step {'/'.join(map(str, steps))}" if steps else "never in place"


def change_line(
    table: LayoutRows,
    plan: TopologyPlan,
    runs: Sequence[ConfigRun],
    links: Sequence[LinkInfo] = (),
) -> str:
    """With a change: comm auto's settled step after it against torch's, and how many steps
    each took to recover ('' without a change)."""
    if plan.change is None:
        return ""
    torch, auto = table.row(BASELINE.name), table.row("auto")
    mine = [r for r in runs if r.layout == table.layout and r.change is not None]
    rtts = [r.change.probed.get("measured", {}).get("p50_ms") for r in mine]
    probed = "/".join(f"{x:.1f}" for x in rtts if x is not None) or "-"
    off = sum(1 for r in mine if r.change.mismatch)
    verdict = f", {off} of {len(mine)} probes NOT as asked" if off else ""
    idle = [lk for lk in links if lk.layout == table.layout and lk.what != "the link"]
    idle_rtt = [x for lk in idle if (x := lk.figure("measured", "p50_ms")) is not None]
    bulk = [x for lk in idle if (x := lk.figure("bulk", "mbit_s")) is not None]
    verified = ""
    if idle_rtt:
        rate = f", bulk {'/'.join(f'{x:.1f}' for x in bulk)} Mbit/s" if bulk else ""
        verified = (
            f"; verified idle after each job: round trip p50 "
            f"{'/'.join(f'{x:.1f}' for x in idle_rtt)} ms{rate}"
        )
    head = (
        f"link change to {plan.change.text} ({table.layout}): {_effective(table)}; "
        f"probed during the jobs: round trip p50 {probed} ms{verdict}{verified}"
    )
    if torch is None or auto is None:
        return head
    ratio = auto.after_ms / torch.after_ms if torch.after_ms else math.nan
    return (
        f"{head}; settled step comm auto {_num(auto.after_ms, '.1f')} ms vs torch DDP "
        f"{_num(torch.after_ms, '.1f')} ms ({_num(ratio, '.2f', 'x')}); steps to recover: "
        f"comm auto {_recover(auto)}, torch DDP {_recover(torch)}"
    )


def cores_line(summary: TopologySummary) -> str:
    """Beside the figures: every rank shares the host's cores, so compute grows with them."""
    cores = summary.result.cpus
    limits = [
        f"{t.row(LIMIT.name).median_step_ms:.0f} ms at {t.layout}"
        for t in summary.layouts
        if t.row(LIMIT.name) is not None
    ]
    where = f"this host's {cores} cores" if cores else "this host's cores"
    return (
        f"note: every rank of every layout shares {where}, so compute per step grows with the "
        f"ranks; the limit (no link cost) shows it: {', '.join(limits) or '-'}"
    )


def headline_line(rows: Sequence[Row], plan: TopologyPlan, title: str = "") -> str:
    """One layout's line: every configuration's step time as a ratio of torch's DDP's, then
    torch's and ours as a ratio of the limit's."""
    by_name = {r.config: r for r in rows}
    title = title or plan.layouts[0].describe()
    parts = [
        f"{by_name[name].label} {_num(by_name[name].step_time_vs_torch, '.2f', 'x')}"
        for name in HEADLINE_ORDER
        if name in by_name
    ]
    limit = [
        f"{by_name[name].label} {_num(by_name[name].step_time_vs_limit, '.2f', 'x')}"
        for name in (BASELINE.name, *HEADLINE_ORDER)
        if name in by_name and LIMIT.name in by_name
    ]
    vs_limit = f"; vs the limit: {', '.join(limit)}" if limit else ""
    return (
        f"step time vs torch DDP ({title}, {plan.link_text}): "
        + (", ".join(parts) or "-")
        + vs_limit
    )


def auto_cap_line(rows: Sequence[Row]) -> str:
    """The auto cap against the fastest of ours flat at a fixed cap (the base cap and every
    ``--caps`` row), with that cap's own run-to-run spread: how close the choice came ('' when
    the auto cap or --caps did not run)."""
    auto = next((r for r in rows if r.config == "auto-cap"), None)
    fixed = [r for r in rows if r.config == "flat" or r.config.startswith("cap")]
    if auto is None or len(fixed) < 2:
        return ""
    best = min(fixed, key=lambda r: r.median_step_ms)
    rounds = best.round_step_ms
    spread = (max(rounds) - min(rounds)) / best.median_step_ms if len(rounds) > 1 else math.nan
    chose = ", ".join(f"{c:g} MB" for c in auto.auto_caps) or "nothing recorded"
    return (
        f"auto cap ({auto.layout}): chose {chose}; median step {auto.median_step_ms:.1f} ms, "
        f"{auto.median_step_ms / best.median_step_ms:.2f}x the fastest fixed cap's of "
        f"{len(fixed)} ({best.title}: {best.median_step_ms:.1f} ms, its rounds "
        f"{'/'.join(f'{m:.0f}' for m in rounds)} ms: spread {_num(100 * spread, '.0f', '%')})"
    )


def closing(summary: TopologySummary) -> Closing:
    """The tables (each followed by comm auto's plans and the change's line), the note on the
    cores; then (after the 'took' line and what broke) the auto cap's line and one line per
    layout, the last lines."""
    plan, result = summary.result.plan, summary.result
    table: list[str] = []
    for t in summary.layouts:
        table.append(format_table(t, plan, result.links))
        table += [x for x in (plans_line(t), change_line(t, plan, result.runs, result.links)) if x]
    table.append(cores_line(summary))
    after = [x for t in summary.layouts if (x := auto_cap_line(t.rows))]
    after += [headline_line(t.rows, plan, t.title) for t in summary.layouts]
    return Closing(table, after)


# ------------------------------------------------------------------------------------------
# The files of a ``lab topology`` run in ``runs/<run-id>/``: ``topology.txt`` (the tables and
# the last lines, as printed), ``topology.csv``, ``topology.json`` (definitions, settings, the
# links, rows, every job with its measured window and its link change), ``topology.png``, and per
# job ``<job>/eth0-node<N>.txt`` (the sampled counters every byte figure comes from). From the
# run's summary.


def _plain(value: object) -> object:
    """NaN as null (not measured) in JSON, as an empty cell in CSV."""
    return None if isinstance(value, float) and math.isnan(value) else value


_NESTED = ("recoveries", "plans")  # in the JSON only
_DERIVED = ("before_ms", "after_ms", "steps_to_recover")  # from the recoveries


def _write_csv(path: Path, rows: list[Row]) -> None:
    names = [f.name for f in dataclasses.fields(Row) if f.name not in _NESTED]
    names += list(_DERIVED)
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(names)
        for r in rows:
            values = [_plain(getattr(r, n)) for n in names]
            out.writerow(
                [
                    "" if v is None else "/".join(map(str, v)) if isinstance(v, tuple) else v
                    for v in values
                ]
            )


def _job_doc(run: ConfigRun, figures_: JobFigures) -> dict:
    window = figures_.window
    return {
        "job": run.job,
        "config": run.conf,
        "round": run.round,
        "exit_codes": run.codes,
        "parity": run.parity,
        "seconds": round(run.seconds, 1),
        "steps_measured": figures_.steps,
        "window": None if window is None else dataclasses.asdict(window),
        "layout": run.layout,
        "change": None if run.change is None else dataclasses.asdict(run.change),
        "recovery": None if figures_.recovery is None else dataclasses.asdict(figures_.recovery),
    }


def write_files(summary: TopologySummary) -> list[Path]:
    """Every file of the run; the paths written."""
    result, rows, jobs = summary.result, summary.rows, summary.jobs
    plan, run_dir = result.plan, result.run_dir
    files = [run_dir / f"topology.{ext}" for ext in ("txt", "csv", "png", "json")]
    lines = closing(summary)
    files[0].write_text("\n".join([*lines.table, *lines.after]) + "\n")
    _write_csv(files[1], rows)
    plot_step_times(
        files[2],
        summary.layouts,
        f"{plan.link_text} between nodes, model {plan.train.model}, {plan.cap_text}",
    )
    for run in result.runs:
        for node, text in run.counters.items():
            (run_dir / run.job).mkdir(parents=True, exist_ok=True)
            (run_dir / run.job / f"eth0-node{node}.txt").write_text(text)
    settings = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)}
    settings["layouts"] = [lay.name for lay in plan.layouts]
    settings["change"] = None if plan.change is None else dataclasses.asdict(plan.change)
    doc = {
        "run_id": result.run_id,
        "settings": {**settings, "train": plan.train.to_dict()},
        "definitions": DEFINITIONS,
        "links": [dataclasses.asdict(link) for link in result.links],
        "rows": [
            {k: _plain(v) for k, v in dataclasses.asdict(r).items() if k != "recoveries"}
            | {k: _plain(getattr(r, k)) for k in _DERIVED}
            for r in rows
        ],
        "headlines": lines.after[-len(summary.layouts) :] if summary.layouts else [],
        "headline": lines.after[-1] if lines.after else "",
        "cpus": result.cpus,
        "jobs": [_job_doc(run, jobs[run.job]) for run in result.runs],
        "seconds": round(result.seconds, 1),
        "files": [f.name for f in files],
    }
    files[3].write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return files


# ------------------------------------------------------------------------------------------
# ``lab topology``'s page: the first layout's step times against torch's DDP and the limit as
# the headline, a table per layout (step time, network cost, cross-node bytes measured on the
# link, steps to recover, parity), the figure, every verified link and every rank's exit. From
# the run's summary.

_HEADERS = (
    "configuration",
    "median step ms",
    "per round",
    "network ms",
    "net vs torch",
    "vs torch",
    "vs limit",
    "cross-node MB/step",
    "buckets",
    "max|dparam|",
    "recover",
    "parity",
)
_FILES = [
    ("topology.txt", "the table and the headline"),
    ("topology.csv", "the table"),
    ("topology.json", "settings, definitions, the link, every job"),
]


def _cell(value: float | None) -> object:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else value


def page(summary: TopologySummary) -> Results:
    """The page and the run's summary.json fields."""
    result = summary.result
    plan = result.plan
    tables = []
    for t in summary.layouts:
        rows = [
            [
                r.title,
                r.median_step_ms,
                "/".join(f"{m:.0f}" for m in r.round_step_ms),
                _cell(r.network_ms),
                _cell(r.network_vs_torch),
                _cell(r.step_time_vs_torch),
                _cell(r.step_time_vs_limit),
                _cell(r.cross_mb_per_step),
                _cell(r.buckets),
                _cell(r.max_param_diff),
                "/".join("-" if n is None else str(n) for n in r.steps_to_recover) or "-",
                "holds" if r.parity else "BROKEN",
            ]
            for r in t.rows
        ]
        where = f"{t.title}, {plan.link_text} between nodes, model {plan.train.model}"
        caption = f"{where}, {plan.cap_text}; medians over the rounds; {cores_line(summary)}"
        tables.append(Table(_HEADERS, rows, caption))
    links = [[lk.layout, lk.what, lk.shaper, lk.line, lk.note] for lk in result.links]
    sections = [
        Section("Per layout and configuration", tables),
        figures_section(result.run_dir, [("topology.png", "step time per configuration")]),
        Section(
            "The link between the nodes, as the probe measured it",
            [Table(("layout", "when", "shaper", "probe", "note"), links)],
        ),
    ]
    lines = [headline_line(t.rows, plan, t.title) for t in summary.layouts]
    figure = lines[0].split(": ", 1)[-1] if lines else "-"
    headline = (summary.broken, "parity holds in every job", figure)
    several = len(summary.layouts) > 1
    configs = {
        f"{r.label} ({r.layout})" if several else r.label: r.median_step_ms for r in summary.rows
    }
    ranks = {r.job: r.codes for r in result.runs}
    return sweep_results("topology", result, sections, ranks, headline, configs, _FILES)


# ------------------------------------------------------------------------------------------
# The command: its flags, the plan from them, the report.

NAME = "topology"
HELP = "nodes x ranks with a slow link between nodes: flat ring vs a two-level allreduce"
DESCRIPTION = textwrap.fill(
    "Delays the link between nodes (not within one: ranks of a node share its container and "
    "talk over loopback), verifies it, then trains the same job in each layout: the limit "
    "(torch's DDP on the bare link, the shaping cleared for it), torch's DDP as shipped (25 MB "
    "cap, gloo's flat ring), ours on the flat ring, ours with the hierarchical hook (reduce "
    "within the node, allreduce across the node leaders, broadcast within), the same with fp16 "
    "on the cross-node leg, and ours with comm auto (bucket cap and algorithm chosen together "
    "from what it measured). A flat ring over N ranks waits 2(N-1) times on the slow link per "
    "allreduce; across M node leaders it waits 2(M-1) times. Reports per row the median step "
    "time, its network cost (minus the limit's), the bytes that crossed the link per step "
    "(measured on every node's eth0), the ratio to torch's DDP and ddp's parity verdict.",
    width=92,
)


EPILOG = "\n".join(
    [
        "The reference is torch's DDP as its users run it: every row but comm auto at",
        "--bucket-cap-mb 25, one bucket of the deep MLP's 2.67 MB. --lesson per-tensor runs",
        "every row at cap 0 instead (one allreduce per tensor: 24 latency-bound allreduces per",
        "step, where a two-level allreduce pays most). Every rank of every layout shares this",
        "host's cores, so compute per step grows with the ranks: the limit row shows how much.",
        "The table's figures:",
        *common.definitions(DEFINITIONS),
        "The last lines, one per layout, for scripts:",
        "  step time vs torch DDP (2 nodes x 2 ranks, 5 ms): comm auto R, hierarchical R,",
        "  hierarchical-fp16 R, flat R; vs the limit: torch DDP R, comm auto R, ...",
        "  (R: median step time / torch DDP's or the limit's, e.g. 0.45x; < 1 is faster)",
        "Files in runs/<run-id>/: topology.txt (the tables), topology.csv, topology.json,",
        "topology.png (step time per configuration and layout), and per job",
        "<layout>-<configuration>-r<round>/ with logs/rank<R>.jsonl, node<N>.log and",
        "eth0-node<N>.txt (the sampled byte counters).",
        "Exit codes: 0 every job finished with parity holding, 1 a job failed or parity broke,",
        "2 bad arguments, 130 interrupted.",
    ]
)

_TRAIN_FIELDS = ["model", "steps", "batch_size", "bucket_cap_mb", "seed"]
_QUICK = f"--quick {QUICK['rounds']}"


def add_arguments(p: argparse.ArgumentParser) -> None:
    link = p.add_argument_group("the link between nodes (verified by the probe before training)")
    link.add_argument(
        "--ms",
        type=common.number(0),
        default=5.0,
        help="one-way delay in ms; none within a node (default %(default)g)",
    )
    link.add_argument(
        "--rate-mbit",
        type=common.number(0, strict=True),
        metavar="R",
        help="also cap each node's link at R Mbit/s (default: no cap)",
    )
    common.add_shaper(link)
    layout = p.add_argument_group("the layouts and the measurement")
    layout.add_argument(
        "--layouts",
        metavar="NxR,...",
        help="several layouts in one command, e.g. 2x2,4x2,2x4,8x1: N nodes x R ranks each, "
        "one cluster and one table each (default: --nodes x --ranks-per-node)",
    )
    common.add_nodes(layout, None, shown=2, what="containers")
    layout.add_argument(
        "--ranks-per-node",
        type=common.number(1, kind=int),
        help="ranks in each container, on its loopback (default 2; with 1 the two-level rows "
        "would be the flat ring and are left out)",
    )
    common.add_warmup(
        layout,
        TopologyPlan.warmup,
        " and the bytes: gloo's set-up, the bucket rebuild, comm auto's measurements",
    )
    common.add_rounds(
        layout,
        "every configuration this often, interleaved, steps pooled "
        f"(default {TopologyPlan.rounds}; {_QUICK})",
    )
    layout.add_argument(
        "--quick",
        action="store_true",
        help=f"a few minutes: {QUICK['rounds']} round of {QUICK['steps']} steps "
        "(where --rounds and --steps are not given)",
    )
    layout.add_argument(
        "--caps",
        type=common.float_list,
        default=(),
        help="also run ours flat at these bucket caps (MB, comma-separated) and the auto "
        "bucket cap alone, judged against them (default: none)",
    )
    layout.add_argument(
        "--lesson",
        choices=tuple(LESSONS),
        help="a lesson variant: per-tensor runs every row at --bucket-cap-mb 0, one "
        "allreduce per tensor (default: none, torch's defaults)",
    )
    add_change_flags(p, "every node's link (the limit's stays bare)")
    common.add_job_flags(p, _TRAIN_FIELDS, TRAIN_DEFAULTS, "one job")


def _layouts(args: argparse.Namespace) -> tuple[Layout, ...]:
    if args.layouts is not None:
        if args.nodes is not None or args.ranks_per_node is not None:
            raise ValueError("give --layouts or --nodes/--ranks-per-node, not both")
        return parse_layouts(args.layouts)
    return (Layout(args.nodes or 2, 2 if args.ranks_per_node is None else args.ranks_per_node),)


def plan(args: argparse.Namespace) -> TopologyPlan:
    train = config_from_args(args, [*_TRAIN_FIELDS, "collective_timeout_s"], TRAIN_DEFAULTS)
    quick = QUICK if args.quick else {}
    if train.steps == TRAIN_DEFAULTS.steps:
        train = train.replace(steps=quick.get("steps", train.steps))
    if args.lesson and train.bucket_cap_mb == TRAIN_DEFAULTS.bucket_cap_mb:
        train = train.replace(bucket_cap_mb=LESSONS[args.lesson])
    return TopologyPlan(
        layouts=_layouts(args),
        ms=args.ms,
        rate_mbit=args.rate_mbit,
        shaper=args.shaper,
        warmup=args.warmup,
        rounds=args.rounds or quick.get("rounds", TopologyPlan.rounds),
        train=train,
        **common.run_fields(args),
        quick=args.quick,
        caps=tuple(args.caps),
        lesson=args.lesson or "",
        change=ChangePlan.from_args(args),
    )


def report(result: TopologyResult) -> int:
    """Exit 0 when every job finished with parity holding, else 1."""
    return report_sweep(result, analyse, files=write_files, console=closing, page=page, name=NAME)
