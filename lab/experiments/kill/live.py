"""``python -m lab kill --recovery live``: the survivors of a lost rank go on in a new quorum
within seconds, a replacement heals from a peer (``--rejoin``), nothing restarts and nothing
is read from disk; measured beside the restart path on the same job.

ddp does the recovery (:mod:`ddp.recovery`); the lab runs its coordinator in a container of
its own, injects the fault, starts the replacement, and reads the ranks' typed records.

One module, read top to bottom in the order data flows: the plan (pure, validated), the
result, the run on the engine, the analysis (pure: one :class:`LiveSummary`), then what is
printed, ``live.json`` and the page, each from that summary alone; last the command line's
choices that need more than argparse, and :func:`report`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import math
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ddp.torchfree import (
    CommitRecord,
    ConfigRecord,
    DeciderRecord,
    Headline,
    HealRecord,
    Page,
    QuorumRecord,
    RankLog,
    Record,
    RecoveryVerdictRecord,
    Section,
    StepRecord,
    Text,
    TrainConfig,
    load_attempts,
    recovery_figures,
    recovery_timeline,
    torchft_agreement,
)
from lab.engine.client import RunTimeout, connect
from lab.engine.cluster import Cluster
from lab.engine.etcd import ETCD_MEMBERS, decider_argv, job_env, lab_etcd
from lab.engine.events import Event, ExitEvent, LineEvent, RecordEvent
from lab.engine.job import Job
from lab.engine.layout import Layout
from lab.engine.specs import DEFAULT_IMAGE
from lab.engine.training import train_argvs
from lab.experiments.kill.restart import KillPlan, KillResult, checkpoint_dir, run_timeout
from lab.experiments.kill.restart import run as run_restart
from lab.experiments.kill.shared import tidy_line
from lab.faults import FAULTS, Fault
from lab.measure.moments import Moment, first_moment
from lab.progress import Progress
from lab.report.common import command_line
from lab.report.publish import publish
from lab.report.results import Results
from lab.report.summary import RunSummary, started_at

__all__ = [
    "COORDINATOR_LOST",
    "COORDINATOR_PORT",
    "ETCD_MEMBERS",
    "FILE",
    "LEGEND",
    "LIVE_MODES",
    "LIVE_TRAIN",
    "RECOVERIES",
    "TARGETS",
    "LivePlan",
    "LiveResult",
    "LiveSummary",
    "Moment",
    "PathRow",
    "Verdict",
    "analyse",
    "compared",
    "headline",
    "judge",
    "lines",
    "live_records",
    "live_row",
    "page",
    "report",
    "require_torchft",
    "restart_row",
    "run",
    "step_period_ms",
    "table",
    "write_files",
]

# The plan: the job, the fault, the replacement, and the restart path it is compared with.
# Pure and validated before any container exists.
#
# The ranks run one per container (nodes 0..N-1) and the coordinator in a container of its own
# (node N), so no rank's fault takes it along: under ``--recovery live`` that is the launcher's
# decider (``ddp.recovery.etcd.decider``), and the job's etcd runs in three more containers
# (nodes N+1..N+3), so that a member's loss is a container's (``--target etcd --count 1|2``);
# under torchft, its lighthouse. The restart path is the same job under ``lab kill --recover``
# (checkpoints every ``restart_checkpoint_every`` steps, every rank restarted after the fault,
# resumed from the newest checkpoint): the row the live path is measured against, run by the
# same command on the same containers' image.

COORDINATOR_PORT = 29500
# What the fault hits: a rank (--rank), the coordinator's container (--target coordinator), or
# --count of the etcd members' containers (--target etcd).
TARGETS = ("rank", "coordinator", "etcd")
# ddp's exit code for a rank whose control plane stopped answering (etcd lost its majority):
# it stops rather than train on with nobody to notice the next fault.
COORDINATOR_LOST = 5
LIVE_MODES = ("kill", "pause", "partition")
# The tower model (82 tensors, 1.1 MB): big enough that healing moves real bytes. A short
# sleep per step keeps the steps apart so the fault lands inside the one it is aimed at.
LIVE_TRAIN = TrainConfig(
    model="tower",
    steps=40,
    batch_size=64,
    step_delay_ms=100.0,
    collective_timeout_s=10.0,
    recovery="live",
    heartbeat_timeout_s=2.0,
)
_SLACK_S = 120.0
# ours, or the same job under torchft (its lighthouse where our coordinator runs)
RECOVERIES = ("live", "torchft")


@dataclass(frozen=True)
class LivePlan:
    """One ``lab kill --recovery live`` run."""

    rank: int
    at_step: int
    mode: str
    train: TrainConfig = field(default_factory=lambda: LIVE_TRAIN)
    nodes: int = 4
    rejoin: bool = False
    compare: bool = True  # also run the restart path on the same job
    recovery: str = "live"  # "torchft": torchft's Manager and lighthouse drive the same job
    torchft: bool = False  # (live) also run the same job under torchft, for its row
    restart_checkpoint_every: int = 2
    target: str = "rank"  # one of TARGETS; otherwise rank is the one whose step times it
    count: int = 1  # --target etcd: how many of its members the fault hits
    run_timeout_s: float | None = None
    image: str = DEFAULT_IMAGE
    runs_dir: Path = Path("runs")
    progress: bool = True

    def __post_init__(self) -> None:
        if self.mode not in LIVE_MODES:
            raise ValueError(
                f"--recovery live takes --mode {', '.join(LIVE_MODES)}, got {self.mode!r}"
            )
        if self.nodes < 3:
            raise ValueError(
                f"--recovery live needs --nodes >= 3, got {self.nodes}: after losing one rank "
                "the survivors must be more than half of the quorum to go on"
            )
        if not 0 <= self.rank < self.nodes:
            raise ValueError(f"--rank must be in 0..{self.nodes - 1}, got {self.rank}")
        if not 2 <= self.at_step < self.train.steps:
            raise ValueError(
                f"--at-step must be in 2..{self.train.steps - 1} (a step before the fault to "
                f"measure, one after it to commit), got {self.at_step}"
            )
        if self.recovery not in RECOVERIES:
            raise ValueError(
                f"recovery must be one of {', '.join(RECOVERIES)}, got {self.recovery!r}"
            )
        if self.train.recovery != self.recovery:
            raise ValueError(f"the training config must have recovery={self.recovery!r}")
        if self.target not in TARGETS:
            raise ValueError(f"--target must be one of {', '.join(TARGETS)}, got {self.target!r}")
        if self.target != "rank":
            both = [f for f, on in (("--rejoin", self.rejoin), ("--compare", self.compare)) if on]
            if self.recovery != "live" or self.torchft or both:
                raise ValueError(
                    f"--target {self.target} hits our control plane, which only --recovery "
                    "live has, and replaces no rank and compares with no other path: "
                    f"drop {', '.join(both) or '--compare torchft'}"
                    if self.recovery == "live"
                    else f"--target {self.target} goes with --recovery live"
                )
        if not 1 <= self.count <= (ETCD_MEMBERS if self.target == "etcd" else 1):
            raise ValueError(
                f"--count is how many of the {ETCD_MEMBERS} etcd members --target etcd hits "
                f"(1..{ETCD_MEMBERS}), got {self.count}"
                if self.target == "etcd"
                else f"--count goes with --target etcd (got {self.count})"
            )
        if self.torchft and self.recovery == "torchft":
            raise ValueError("a torchft run compares with torchft itself: drop torchft=True")
        if self.compare and not 1 <= self.restart_checkpoint_every < self.at_step:
            raise ValueError(
                f"the restart path checkpoints every {self.restart_checkpoint_every} steps: "
                f"that must be >= 1 and below --at-step {self.at_step}"
            )
        self.train.local_batch(self.nodes)
        object.__setattr__(self, "run_timeout_s", run_timeout(self.run_timeout_s, self.train))
        if self.compare:
            self.restart_plan()  # the restart path's plan validates too

    @property
    def layout(self) -> Layout:
        """The ranks' nodes: one rank each. The coordinator's node and etcd's come after."""
        return Layout(self.nodes, 1)

    @property
    def cluster_layout(self) -> Layout:
        return Layout(self.nodes + 1 + len(self.etcd_nodes), 1)

    @property
    def coordinator_node(self) -> int:
        return self.nodes

    @property
    def etcd_nodes(self) -> tuple[int, ...]:
        """The etcd members' nodes (``--recovery live`` only), after the coordinator's."""
        first = self.coordinator_node + 1
        return tuple(range(first, first + ETCD_MEMBERS)) if self.recovery == "live" else ()

    @property
    def fault_nodes(self) -> tuple[int, ...]:
        """The nodes the fault hits: the rank's (one rank per node), the coordinator's, or the
        first ``count`` etcd members'."""
        if self.target == "etcd":
            return self.etcd_nodes[: self.count]
        return (self.coordinator_node if self.target == "coordinator" else self.rank,)

    @property
    def lost(self) -> int | None:
        """The rank the fault takes away (None: the control plane was hit, not a rank)."""
        return self.rank if self.target == "rank" else None

    @property
    def target_text(self) -> str:
        if self.target == "etcd":
            return f"{self.count} of the {ETCD_MEMBERS} etcd members"
        if self.target == "coordinator":
            return "the launcher's decider"
        return f"rank {self.rank}"

    @property
    def lifetime_s(self) -> float:
        assert self.run_timeout_s is not None
        return math.ceil(2 * self.run_timeout_s + _SLACK_S)

    def config(self, coordinator: str | None) -> TrainConfig:
        """Every rank's config (a replacement's too): torchft's lighthouse at ``HOST:PORT``;
        ours finds etcd in the environment (None)."""
        return self.train.replace(coordinator=coordinator)

    def coordinator_argv(self) -> list[str]:
        """Our decider, or torchft's lighthouse: a quorum needs more than half the ranks
        (half rounded up), so a split is refused as ours refuses it."""
        assert self.run_timeout_s is not None
        if self.recovery == "torchft":
            return [
                "python",
                "-m",
                "ddp.recovery.demo.torchft.lighthouse",
                "--port",
                str(COORDINATOR_PORT),
                "--min-replicas",
                str(math.ceil(self.nodes / 2)),
            ]
        return decider_argv(self.nodes, self.train.heartbeat_timeout_s, self.lifetime_s)

    def torchft_plan(self) -> LivePlan:
        """The same job, fault and replacement under torchft (no comparison runs of its own)."""
        train = self.train.replace(recovery="torchft")
        return dataclasses.replace(
            self, train=train, recovery="torchft", compare=False, torchft=False
        )

    def restart_plan(self) -> KillPlan:
        """The same job on the restart path: checkpoints, the fault, every rank restarted."""
        train = self.train.replace(
            recovery="restart",
            coordinator=None,
            checkpoint_every=self.restart_checkpoint_every,
            checkpoint_dir=checkpoint_dir("fault"),
        )
        return KillPlan(
            rank=self.rank,
            at_step=self.at_step,
            mode=self.mode,
            train=train,
            nodes=self.nodes,
            recover=True,
            run_timeout_s=self.run_timeout_s,
            image=self.image,
            runs_dir=self.runs_dir,
            progress=self.progress,
        )

    def describe(self) -> str:
        t = self.train
        rejoin = ", then a replacement joins" if self.rejoin else ""
        node = (
            "a lighthouse node (torchft)"
            if self.recovery == "torchft"
            else f"a coordinator node, {ETCD_MEMBERS} etcd nodes"
        )
        return (
            f"{self.layout.describe()} and {node}, model {t.model}, {t.steps} steps "
            f"({t.step_delay_ms:g} ms step delay), heartbeat timeout {t.heartbeat_timeout_s:g} "
            f"s; fault: {self.mode} {self.target_text} in step {self.at_step}{rejoin}"
        )


# What a run hands to its report: plain data, so the report is built and tested from
# synthetic records as well as from a real run.


@dataclass
class LiveResult:
    plan: LivePlan
    run_id: str
    run_dir: Path
    moments: list[Moment]
    logs: dict[str, dict[int, list[RankLog]]]  # job ("live", "rejoin") -> rank -> attempts
    codes: dict[str, dict[int, int]]  # job -> rank (the coordinator: node) -> exit code
    restart: KillResult | None  # the restart path on the same job, when it ran
    seconds: float = 0.0
    torchft: LiveResult | None = None  # the same job under torchft, when it ran
    ended: dict[str, dict[int, float]] = field(default_factory=dict)  # job -> rank -> exit t

    def moment(self, kind: str) -> Moment | None:
        return first_moment(self.moments, kind)


# The run: the job's etcd in three containers, the launcher's decider in one, one rank per
# container, the fault injected when the target's records say so, a replacement started once
# the survivors committed a step without it (``--rejoin``); then, on fresh containers, the
# restart path.
#
# The jobs are followed only through their typed records (the fault's trigger, the survivors'
# first commit at the smaller world, the end): :mod:`ddp.recovery.records`.

_Echo = Callable[[str], None]
_WAIT_S = 0.05  # poll slice per job when following several
_END_GRACE_S = 60.0  # after the survivors, how long the rest (replacement, coordinator) get
_QUIET_S = 60.0  # coordinator lost: slack on top of the heartbeat and collective timeouts


class _Echo2:
    """Every job's lines under its name; rank 0's steps (or the lowest survivor's) as progress."""

    def __init__(self, plan: LivePlan, echo: _Echo) -> None:
        self.progress = Progress(plan.train.steps, enabled=plan.progress, echo=echo)
        self.moved = time.monotonic()  # the last committed step or exit of a rank

    def __call__(self, job: str) -> Callable[[Event], None]:
        def follow(event: Event) -> None:
            if isinstance(event, LineEvent):
                who = f"node{event.node}" if event.rank is None else f"rank{event.rank}"
                self.progress.write(f"[{job} {who}] {tidy_line(event.text)}")
            elif isinstance(event, RecordEvent):
                record = event.record
                if isinstance(record, CommitRecord) and record.committed:
                    self.progress.update(record.step)
                    self.moved = time.monotonic()
            elif isinstance(event, ExitEvent):
                self.moved = time.monotonic()

        return follow


def _until(jobs: list[Job], hit: Callable[[Event], bool], timeout_s: float, what: str) -> Event:
    """Poll every job in turn until an event of any satisfies ``hit``; RunTimeout naming
    ``what`` otherwise."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for job in jobs:
            event = job.poll(_WAIT_S)
            if event is not None and hit(event):
                return event
    raise RunTimeout(f"live run: {what} did not happen within {timeout_s:g} s")


def _drain(
    jobs: list[Job],
    ranks: dict[str, list[int]],
    timeout_s: float,
    stalled: Callable[[], bool] = lambda: False,
) -> None:
    """Follow every job until each one's ``ranks`` exited, the deadline, or ``stalled()``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not stalled():
        if all(all(r in j.exits for r in ranks.get(j.name, j.ranks)) for j in jobs):
            return
        for job in jobs:
            job.poll(_WAIT_S)


def _trigger(plan: LivePlan) -> Callable[[Event], bool]:
    """The target's commit of the step before (the coordinator as the target: rank
    ``plan.rank``'s, rank 0 by default): a live rank records a step once its vote passed, at
    the start of the next step's check, so its step record comes a step late."""

    def hit(event: Event) -> bool:
        r = event.record if isinstance(event, RecordEvent) else None
        return (
            isinstance(r, CommitRecord)
            and r.rank == plan.rank
            and r.committed
            and r.step == plan.at_step - 1
        )

    return hit


def _committed_without(plan: LivePlan) -> Callable[[Event], bool]:
    """A step committed at world N-1; under torchft at any smaller world: its lighthouse may
    form a quorum without a survivor still stuck in the old group's allreduce (it heals back
    in later), and the replacement should not wait for that."""
    smaller = plan.recovery == "torchft"

    def hit(event: Event) -> bool:
        r = event.record if isinstance(event, RecordEvent) else None
        world = r.world_size if isinstance(r, CommitRecord) and r.committed else None
        return world is not None and (world < plan.nodes if smaller else world == plan.nodes - 1)

    return hit


@contextlib.contextmanager
def _control_plane(
    cluster: Cluster, plan: LivePlan, follow: _Echo2, echo: _Echo
) -> Iterator[tuple[Job, TrainConfig, dict[str, str] | None]]:
    """Ours: the job's etcd (three containers) and the launcher's decider; torchft's: its
    lighthouse. Yields the decider's (lighthouse's) job, the ranks' config and environment."""
    host = cluster.address(plan.coordinator_node)
    argv = {plan.coordinator_node: plan.coordinator_argv()}
    with contextlib.ExitStack() as stack:
        env = None
        if plan.recovery == "live":
            # etcd listens on the run's network only, with mutual TLS; the job's secret and id
            # go to the decider and to every rank in the environment, never on a command line.
            etcd = stack.enter_context(lab_etcd(cluster, plan.etcd_nodes, plan.lifetime_s))
            env = job_env(etcd)
            where = ", ".join(f"node{n}" for n in etcd.nodes)
            serves, cfg = f"etcd on {where}, the decider", plan.config(None)
        else:
            serves, cfg = "torchft's lighthouse", plan.config(f"{host}:{COORDINATOR_PORT}")
        coordinator = cluster.job(
            "coordinator", argv, plan.lifetime_s, per_node=True, echo=follow("coordinator"), env=env
        )
        echo(f"== {plan.recovery}: {plan.nodes} ranks, {serves} at {host} (node{plan.nodes})")
        yield coordinator, cfg, env


def _inject(plan: LivePlan, faults: list[Fault]) -> Moment:
    """Every fault of the plan, in turn (``--count``); the moment is the first one's: when the
    engine says it was in place (a kill: Docker's kill event, logged once the signal was sent),
    else when the Docker call began (it lands somewhere inside the call, so every "after the
    fault" figure is then an upper bound)."""
    start = time.time()
    for fault in faults:
        fault.inject()
    took = time.time() - start
    calls = "the call took" if len(faults) == 1 else f"the {len(faults)} calls took"
    at, when = start, f"{calls} {took:.3f} s"
    if faults[0].landed_at is not None:
        at = faults[0].landed_at
        first = "the call" if len(faults) == 1 else "the first"
        when = f"Docker's kill event {at - start:.3f} s into {first}; {when}"
    detail = "; ".join(dict.fromkeys(f.detail for f in faults))
    return Moment(at, f"lab: {plan.mode} {plan.target_text} ({detail}; {when})", "fault")


def _live(cluster: Cluster, plan: LivePlan, faults: list[Fault], echo: _Echo) -> list[Moment]:
    """The live job, start to end; the lab's own moments (fault, replacement) for the
    timeline."""
    assert plan.run_timeout_s is not None
    follow = _Echo2(plan, echo)
    with _control_plane(cluster, plan, follow, echo) as (coordinator, cfg, env):
        for fault, node in zip(faults, plan.fault_nodes, strict=True):
            fault.prepare(cluster, node)  # one rank per node: the rank's node
        job = cluster.job(
            "live",
            train_argvs("live", plan.layout, cfg),
            plan.run_timeout_s,
            echo=follow("live"),
            env=env,
        )
        jobs = [coordinator, job]
        _until(
            jobs,
            _trigger(plan),
            plan.run_timeout_s,
            f"rank {plan.rank} reporting step {plan.at_step - 1}",
        )
        moments = [_inject(plan, faults)]
        survivors = [r for r in range(plan.nodes) if r != plan.lost]
        if plan.rejoin:
            _until(
                jobs,
                _committed_without(plan),
                plan.run_timeout_s,
                f"a step committed at world {plan.nodes - 1}",
            )
            faults[0].release()
            cluster.restart(plan.rank)  # the old process goes for good; a fresh one replaces it
            argv = train_argvs("rejoin", plan.layout, cfg)[plan.rank]
            jobs.append(
                cluster.job(
                    "rejoin", {plan.rank: argv}, plan.run_timeout_s, echo=follow("rejoin"), env=env
                )
            )
            moments.append(
                Moment(time.time(), f"lab: replacement for rank {plan.rank} started", "replacement")
            )
        stalled = lambda: False  # noqa: E731
        if plan.target != "rank":
            # With the control plane hit, ranks that neither commit nor exit for this long are
            # stuck: the analysis says so rather than wait out the run timeout.
            quiet_s = plan.train.heartbeat_timeout_s + plan.train.collective_timeout_s + _QUIET_S
            stalled = lambda: time.monotonic() - follow.moved > quiet_s  # noqa: E731
        _drain(jobs, {"live": survivors, "coordinator": []}, plan.run_timeout_s, stalled)
        for fault in faults:
            fault.release()  # a paused or cut-off rank may go now
        # torchft's lighthouse serves until its container goes: nobody waits for it to exit
        _drain(jobs, {"coordinator": []} if plan.recovery == "torchft" else {}, _END_GRACE_S)
        follow.progress.close()
        for j in jobs:
            j.close()
    if job.running and any(r in survivors for r in job.running) and plan.target == "rank":
        raise RunTimeout(
            f"live run: survivors {job.running} still running after {plan.run_timeout_s:g} s"
        )
    return moments


def run(plan: LivePlan, echo: _Echo = print) -> LiveResult:
    """The live run on one cluster, then (``plan.compare``) the restart path on another, and
    (``plan.torchft``) the same job under torchft on a third."""
    started = time.monotonic()
    fault_type = FAULTS[plan.mode]
    cluster = Cluster(
        connect(),
        plan.cluster_layout,
        image=plan.image,
        echo=echo,
        lifetime_s=plan.lifetime_s,
        net_admin=fault_type.NET_ADMIN,
    )
    cluster.run_dir = run_dir = plan.runs_dir / cluster.run_id
    echo(f"run {cluster.run_id}: {plan.describe()}; image {plan.image}; output in {run_dir}/")
    with cluster, contextlib.ExitStack() as stack:
        faults = [stack.enter_context(fault_type()) for _ in plan.fault_nodes]
        moments = _live(cluster, plan, faults, echo)
        codes = {j.name: j.codes for j in cluster.jobs}
        ended = {j.name: {r: e.t for r, e in j.exits.items()} for j in cluster.jobs}
    logs = {
        name: load_attempts(run_dir / name / "logs")
        for name in ("live", "rejoin")
        if (run_dir / name / "logs").is_dir()
    }
    restart = None
    if plan.compare:
        echo("== the restart path on the same job (lab kill --recover)")
        restart = run_restart(plan.restart_plan(), echo)
    torchft = None
    if plan.torchft:
        echo("== the same job under torchft (lab kill --recovery torchft)")
        torchft = run(plan.torchft_plan(), echo)
    return LiveResult(
        plan,
        cluster.run_id,
        run_dir,
        moments,
        logs,
        codes,
        restart,
        time.monotonic() - started,
        torchft,
        ended,
    )


# The figures, from the ranks' typed records: one row per recovery path (the time from the
# fault to the next committed step, the healing, the steps redone, the step period without
# faults) and the verdict; :func:`analyse` puts them into the one :class:`LiveSummary` that
# ``live.json``, the console text and the page are built from. Pure: tested from synthetic
# records.
#
# The step period is measured the same way in every row: per step, when the last rank
# finished it (its commit record on the live paths; the end of its step record on the restart
# path, whose steps commit when they end), then the median time between consecutive steps'
# ends, over the steps before the fault (the restart path: the same steps of its uninterrupted
# run). It is what a step costs a user, vote, checkpoint writes and all.


@dataclass(frozen=True)
class PathRow:
    """One way back from the fault. None: did not happen, or does not apply."""

    name: str
    fault_to_commit_s: float | None
    heal_s: float | None
    steps_redone: int | None
    step_ms: float | None  # the step period without faults (measured as the comment above says)


def step_period_ms(ends: Iterable[tuple[int, float]], before: float | None = None) -> float | None:
    """The median time in ms between consecutive steps' ends, given (step, wall-clock end)
    pairs of every rank (a step ends when its last rank ends it), over the steps that ended
    before ``before``; None with fewer than two consecutive steps."""
    last: dict[int, float] = {}
    for step, t in ends:
        last[step] = max(t, last.get(step, t))
    steps = sorted(s for s, t in last.items() if before is None or t < before)
    gaps = [last[b] - last[a] for a, b in itertools.pairwise(steps) if b == a + 1]
    return statistics.median(gaps) * 1e3 if gaps else None


@dataclass(frozen=True)
class Verdict:
    ok: bool
    lines: list[str]


def live_records(result: LiveResult) -> list[Record]:
    """Every record of every attempt of every rank, of the live job and the replacement."""
    return [
        record
        for job in result.logs.values()
        for attempts in job.values()
        for log in attempts
        for record in log.records
    ]


def live_row(result: LiveResult) -> tuple[PathRow, dict]:
    """Ours (or torchft's, for a ``--recovery torchft`` run), and the figures of
    :func:`ddp.recovery.demo.timeline.figures` it came from."""
    name = "torchft" if result.plan.recovery == "torchft" else "ours (live)"
    fault = result.moment("fault")
    if fault is None:
        return PathRow(name, None, None, None, None), {}
    records = live_records(result)
    # The heal figures are the replacement's: a survivor left out of a quorum (it noticed the
    # fault after the check-in window) heals too, and may come first.
    lost = result.plan.lost
    mine = [r for r in records if not isinstance(r, HealRecord) or r.rank == lost]
    figs = recovery_figures(mine, fault.t, result.plan.nodes)
    failed = {r.step for r in records if isinstance(r, CommitRecord) and not r.committed}
    commits = [(r.step, r.t) for r in records if isinstance(r, CommitRecord) and r.committed]
    period = step_period_ms(commits, before=fault.t)
    row = PathRow(name, figs.get("first_commit_s"), figs.get("heal_s"), len(failed), period)
    return row, figs


def restart_row(kill: KillResult | None) -> PathRow | None:
    """The restart path: from the fault to the end of the first step every rank finished after
    resuming, and the steps between the newest checkpoint and the fault, done twice."""
    if kill is None or kill.injection is None:
        return None
    resume = kill.logs.get("resume", {})
    firsts = []
    start_step = None
    for log in resume.values():
        config = next((r for r in log.records if isinstance(r, ConfigRecord)), None)
        start_step = config.start_step if config is not None else start_step
        if log.steps and log.steps[0].t0 is not None:
            firsts.append(log.steps[0].t0 + log.steps[0].step_ms / 1e3)
    to_commit = max(firsts) - kill.injection.end if firsts else None
    redone = None if start_step is None else kill.plan.at_step - 1 - start_step
    # the same steps as ours: those before the step the fault hits
    ref = kill.logs.get("reference", {}).values()
    steps = (s for log in ref for s in log.steps if s.step < kill.plan.at_step)
    period = step_period_ms(_step_ends(steps))
    return PathRow("restart (kill --recover)", to_commit, None, redone, period)


def _step_ends(steps: Iterable[StepRecord]) -> list[tuple[int, float]]:
    return [(s.step, s.t0 + s.step_ms / 1e3) for s in steps if s.t0 is not None]


def judge(result: LiveResult) -> Verdict:
    """Exit 0 only if the survivors committed a step without the lost rank, every member of
    the last quorum says the replicas were identical after every committed step and every
    step was committed, and (``--rejoin``) the replacement healed."""
    if result.plan.target != "rank":
        return _judge_control_plane_loss(result)
    records = live_records(result)
    verdicts = [r for r in records if isinstance(r, RecoveryVerdictRecord)]
    row, figs = live_row(result)
    lines, ok = [], True
    if row.fault_to_commit_s is None:
        ok = False
        lines.append(f"no step was committed at world {result.plan.nodes - 1} after the fault")
    if not verdicts:
        ok = False
        lines.append("no rank wrote a recovery verdict")
    for v in verdicts:
        if not v.holds or v.committed_steps != v.expected_steps:
            ok = False
            lines.append(f"rank {v.rank}: {v.message}")
    agreed, said = True, ""
    if result.plan.recovery == "torchft":  # torchft compares no replicas: their checksums do
        agreed, said = torchft_agreement(records)
        ok = ok and agreed
        if not agreed:
            lines.append(said)
    if result.plan.rejoin and figs.get("heal_from") is None:
        ok = False
        started = result.moment("replacement")
        lines.append(
            "--rejoin asked for a replacement, and it did not happen: "
            + (
                "the replacement did not heal from a peer (it started "
                f"{started.t - result.moment('fault').t:.1f} s after the fault; if the run "
                "ended first, raise --steps)"
                if started is not None and result.moment("fault") is not None
                else "no replacement was started"
            )
        )
    if ok and verdicts:
        lines.append(verdicts[0].message + (f"; {said}" if said else ""))
    return Verdict(ok, lines)


def _judge_control_plane_loss(result: LiveResult) -> Verdict:
    """The decider or etcd members were the target. Fine by design: the job went on to the end
    with every step committed and every member saying the replicas were identical (the
    decider's role moves to a member; etcd answers while a majority lives); or, with etcd's
    majority gone, every rank stopped with ddp's exit code for it and none claimed its replicas
    held (a clean stop). What the plan expects decides which: a lost majority that trained on,
    or one member's loss that stopped the job, fails."""
    plan, fault = result.plan, result.moment("fault")
    what = plan.target_text
    stop_expected = plan.target == "etcd" and plan.count > ETCD_MEMBERS // 2
    codes = result.codes.get("live", {})
    ranks = range(plan.nodes)
    records = live_records(result)
    t = fault.t if fault is not None else 0.0
    verdicts = [r for r in records if isinstance(r, RecoveryVerdictRecord)]
    exits = ", ".join(f"rank {r} {codes.get(r, '-')}" for r in ranks)
    if fault is None:
        return Verdict(False, [f"the fault on {what} never landed"])
    if all(codes.get(r) == COORDINATOR_LOST for r in ranks):
        claimed = [v.rank for v in verdicts if v.holds]
        if claimed:
            return Verdict(False, [f"ranks {claimed} said their replicas held after the loss"])
        ended = result.ended.get("live", {})
        slowest = max((ended[r] - t for r in ranks if r in ended), default=None)
        within = "" if slowest is None else f" within {slowest:.2f} s of the fault"
        said = next(
            (a[-1].failure.message for a in result.logs.get("live", {}).values() if a[-1].failure),
            "no failure record",
        )
        line = (
            f"clean stop: every rank noticed the loss of {what} and stopped with exit "
            f"{COORDINATOR_LOST}{within}; rank 0 said: {said}"
        )
        if not stop_expected:
            return Verdict(False, [f"{line}; but losing {what} should be survived"])
        return Verdict(True, [line])
    if all(codes.get(r) == 0 for r in ranks):
        bad = [v for v in verdicts if not v.holds or v.committed_steps != v.expected_steps]
        if stop_expected:
            return Verdict(
                False,
                [f"every rank trained to the end after losing {what}, a majority of etcd"],
            )
        if verdicts and not bad:
            quorums = sorted(
                {r.quorum_id for r in records if isinstance(r, QuorumRecord) and r.t >= t}
            )
            formed = f"quorums {quorums} formed after it" if quorums else "no new quorum needed"
            took = [r for r in records if isinstance(r, DeciderRecord) and r.t >= t]
            if plan.target == "coordinator":
                if not took:
                    # Survived by luck: had a rank failed, nobody would have decided.
                    return Verdict(
                        False, [f"every rank trained on, but no member took over from {what}"]
                    )
                first = min(took, key=lambda r: r.t)
                formed += f"; rank {first.rank} took the decider role {first.t - t:.2f} s after it"
            return Verdict(
                True, [f"the job survived the loss of {what} ({formed}); {verdicts[0].message}"]
            )
        return Verdict(False, [f"rank {v.rank}: {v.message}" for v in bad] or ["no verdict"])
    stuck = [r for r in ranks if r not in codes]
    if stuck:
        moved = [r.t - t for r in records if isinstance(r, CommitRecord) and r.t >= t]
        last = f"; the last step was committed {max(moved):.1f} s after it" if moved else ""
        return Verdict(
            False,
            [
                f"after the loss of {what} ranks {stuck} neither stopped nor finished "
                f"(stopped by the lab once nothing moved{last}): no rank noticed the loss"
            ],
        )
    return Verdict(
        False,
        [
            f"after the loss of {what} the ranks exited {exits}: neither a clean stop "
            f"(exit {COORDINATOR_LOST} on every rank) nor a survived run"
        ],
    )


@dataclass
class LiveSummary:
    """One live run's figures beside the other paths on the same job, and its verdict."""

    result: LiveResult
    live: PathRow
    figures: Mapping[str, float | int | None]  # ddp.recovery's timeline figures of ours
    verdict: Verdict
    restart: PathRow | None = None
    torchft: PathRow | None = None
    rows: list[PathRow] = field(default_factory=list)  # restart, torchft, ours: the table

    @property
    def ok(self) -> bool:
        return self.verdict.ok


def analyse(result: LiveResult) -> LiveSummary:
    live, figs = live_row(result)
    restart = restart_row(result.restart)
    torchft = live_row(result.torchft)[0] if result.torchft is not None else None
    verdict = judge(result)
    if result.torchft is not None and not judge(result.torchft).ok:
        # its row is still shown; ours is judged on its own
        verdict.lines.append(
            "torchft's run on the same job FAILED: " + "; ".join(judge(result.torchft).lines)
        )
    rows = [r for r in (restart, torchft, live) if r is not None]
    return LiveSummary(result, live, figs, verdict, restart, torchft, rows)


# What is printed, from the run's summary: the timeline from the ranks' records and the lab's
# own moments, the table of recovery paths (its legend says how each column is measured), the
# verdict, and last, one line a script can read. Pure.

LEGEND = [
    "fault -> next committed step: from the fault's moment to the end of the first step every "
    "survivor (restart: every restarted rank) finished after it",
    "step ms without faults: the step period, the median time between consecutive steps' "
    "ends (a step ends when its last rank committed it), over the steps before the fault "
    "(restart: the same steps of its uninterrupted run); the same definition in every row",
]


def _s(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f} s"


def table(rows: Sequence[PathRow]) -> list[str]:
    """One line per path; the same job, link and image in every row; then the legend."""
    out = [
        f"{'path':<26}{'fault -> next committed step':>30}{'healing':>10}"
        f"{'steps redone':>14}{'step ms without faults':>24}"
    ]
    for r in rows:
        step = "-" if r.step_ms is None else f"{r.step_ms:.1f}"
        redone = "-" if r.steps_redone is None else str(r.steps_redone)
        out.append(
            f"{r.name:<26}{_s(r.fault_to_commit_s):>30}{_s(r.heal_s, 3):>10}{redone:>14}{step:>24}"
        )
    return out + [f"  {line}" for line in LEGEND]


def headline(summary: LiveSummary) -> str:
    """E.g. ``live recovery: 0.6 s from the fault to the first committed step at world 3
    (restart path: 21.4 s); rank 2 healed from rank 0 in 0.4 s; replicas identical after every
    committed step``."""
    result, live, figs, verdict = summary.result, summary.live, summary.figures, summary.verdict
    restart, torchft = summary.restart, summary.torchft
    if result.plan.target != "rank":
        said = "; ".join(verdict.lines)
        return f"{result.plan.target_text} lost in step {result.plan.at_step}: " + (
            said if verdict.ok else f"FAILED: {said}"
        )
    # torchft's lighthouse may first form a quorum without a survivor stuck in the old group
    world = figs.get("first_commit_world") or result.plan.nodes - 1
    text = f"{result.plan.recovery} recovery: {_s(live.fault_to_commit_s)} from the fault to "
    text += f"the first committed step at world {world}"
    others = [f"torchft on the same job: {_s(torchft.fault_to_commit_s)}"] if torchft else []
    if restart is not None:
        others.append(f"restart path: {_s(restart.fault_to_commit_s, 1)}")
    if others:
        text += f" ({'; '.join(others)})"
    if figs.get("heal_from") is not None:
        text += (
            f"; rank {result.plan.rank} healed from rank {figs['heal_from']} in "
            f"{_s(figs.get('heal_s'), 3)}"
        )
    return text + (
        "; replicas identical after every committed step"
        if verdict.ok
        else "; FAILED: " + "; ".join(verdict.lines)
    )


def lines(summary: LiveSummary) -> list[str]:
    """Everything printed after the run, the headline last."""
    result, figs = summary.result, summary.figures
    fault = result.moment("fault")
    out = []
    if fault is not None:
        extra = [(m.t, m.text) for m in result.moments]
        out += ["timeline (seconds after the fault; the ranks' records and the lab's moments):"]
        out += recovery_timeline(live_records(result), fault.t, extra)
    if figs.get("startup_s") is not None:
        reg = figs.get("registered_to_step_s")
        out.append(
            f"replacement: {figs['startup_s']:.2f} s from its process start to registering "
            f"(interpreter, torch import), then {_s(reg, 3)} from registering to its first "
            f"committed step ({(figs.get('heal_bytes') or 0) / 1e6:.2f} MB healed)"
        )
    out += ["", *table(summary.rows)]
    out += [f"verdict: {line}" for line in summary.verdict.lines]
    out.append(headline(summary))
    return out


# ``live.json``, from the run's summary: the plan, the lab's moments, the figures, every
# path's row, the exit codes and the verdict.

FILE = "live.json"


def write_files(summary: LiveSummary) -> list[Path]:
    result = summary.result
    doc = {
        "run_id": result.run_id,
        "plan": {k: str(v) for k, v in dataclasses.asdict(result.plan).items()},
        "moments": [dataclasses.asdict(m) for m in result.moments],
        "figures": dict(summary.figures),
        "paths": [dataclasses.asdict(r) for r in summary.rows],
        "definitions": LEGEND,
        "exit_codes": result.codes,
        "restart_run": result.restart.run_id if result.restart else None,
        "torchft_run": result.torchft.run_id if result.torchft else None,
        "ok": summary.ok,
        "verdict": summary.verdict.lines,
        "headline": headline(summary),
    }
    path = result.run_dir / FILE
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return [path]


# The page: the headline line, the timeline and the verdict, the table of recovery paths on
# the same job. From the run's summary.


def page(summary: LiveSummary) -> Results:
    result, live = summary.result, summary.live
    last = headline(summary)
    command = command_line("kill")
    figure = "-" if live.fault_to_commit_s is None else f"{live.fault_to_commit_s:.2f} s to commit"
    made = Page(
        f"lab kill --recovery {result.plan.recovery}: run {result.run_id}",
        Headline(command, last, figure, summary.ok),
        [
            Section("Timeline and verdict", [Text(lines(summary)[:-1])]),
            Section("Recovery paths on the same job", [Text(table(summary.rows))]),
        ],
    )
    run_summary = RunSummary(
        "kill",
        result.run_id,
        command,
        started_at(result.seconds),
        result.seconds,
        figure,
        last,
        summary.ok,
    )
    jobs = [name for name in ("live", "rejoin") if name in result.logs]
    return Results(made, run_summary, [(FILE, "the figures")], jobs)


# The command line's choices for ``--recovery live|torchft`` that need more than argparse:
# which other paths run on the same job (``--compare``), and whether the image can run torchft
# at all (its ``lab.extras`` label, set by ``python -m lab image --extras torchft``).


def compared(args: argparse.Namespace) -> tuple[bool, bool]:
    """(restart, torchft) from ``--compare`` and ``--no-compare``."""
    if args.compare is None:
        return (not args.no_compare, False)
    if args.no_compare:
        raise ValueError("give --compare LIST or --no-compare, not both")
    names = {n.strip() for n in args.compare.split(",") if n.strip()}
    allowed = {"restart", "torchft"} if args.recovery == "live" else {"restart"}
    if names - allowed:
        raise ValueError(
            f"--compare takes {', '.join(sorted(allowed))} with --recovery "
            f"{args.recovery}, got {', '.join(sorted(names - allowed))}"
        )
    return ("restart" in names, "torchft" in names)


def require_torchft(image: str) -> None:
    """The image's ``lab.extras`` label (set by ``lab image --extras``) must name torchft."""
    from lab.engine.build import EXTRAS_LABEL

    try:
        labels = connect().images.get(image).labels or {}
    except Exception as e:  # not found, or no engine: the same one line
        raise ValueError(f"cannot inspect image {image}: {e}") from None
    if "torchft" not in labels.get(EXTRAS_LABEL, "").split(","):
        raise ValueError(
            f"image {image} has no torchft (its {EXTRAS_LABEL} label does not name it): build "
            "one with `python -m lab image --extras torchft --tag ddp-lab:torchft` and pass "
            "--image ddp-lab:torchft"
        )


def report(result: LiveResult) -> int:
    """Print the timeline, the paths and the verdict; write live.json, the page and the
    summary. Exit 0 only if the verdict holds (:func:`judge`)."""
    summary = analyse(result)
    write_files(summary)
    made = page(summary)
    text = lines(summary)
    published = publish(result.run_dir, made.page, made.summary, made.files, made.jobs)
    print("\n".join([*text[:-1], *published, text[-1]]))
    return 0 if summary.ok else 1
