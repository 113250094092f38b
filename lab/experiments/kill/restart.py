"""``lab kill`` on the restart path: the survivors of a fault exit with ddp's diagnosis; with
``--recover`` an uninterrupted run comes first and every rank then resumes from the fault
phase's newest checkpoint, compared bit for bit with it.

One module, read top to bottom in the order data flows: the plan (pure, validated), the
result, the run on the engine, the analysis (pure: the fault report and the recovery check, as
one :class:`RestartSummary`), then what is printed, ``report.json`` and the page, each from
that summary alone; last :func:`report`. The torchrun and live paths build on its plan and
run (:mod:`.torchrun`, :mod:`.live`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ddp.torchfree import (
    ConfigRecord,
    Diagnosis,
    FailureRecord,
    RankLog,
    Section,
    StepRecord,
    Table,
    Text,
    TrainConfig,
    diagnose,
    error_meaning,
    load_dumps,
    load_run,
)
from lab.engine.client import NodeFailed, RunTimeout, connect
from lab.engine.cluster import Cluster
from lab.engine.events import Event, ExitEvent, LineEvent, RecordEvent
from lab.engine.job import Job
from lab.engine.layout import Layout
from lab.engine.specs import DEFAULT_IMAGE, job_dir
from lab.experiments.kill.shared import fmt_s, kill_page, table, tidy_line
from lab.faults import FAULTS, Fault
from lab.progress import Progress
from lab.report.failed import key_figure
from lab.report.publish import publish
from lab.report.results import Results

__all__ = [
    "DEFAULT_TRAIN",
    "DUMP_GRACE_S",
    "HEADINGS",
    "IDENTICAL",
    "PEER_FAILURE_EXIT",
    "RUN_TIMEOUT_HELP",
    "FaultReport",
    "Injection",
    "KillPlan",
    "KillResult",
    "PhaseOutcome",
    "RankRow",
    "Recovery",
    "RestartSummary",
    "analyse",
    "build_report",
    "checkpoint_dir",
    "compare_runs",
    "default_run_timeout",
    "lines",
    "page",
    "report",
    "run",
    "run_timeout",
    "summary_dict",
    "write_files",
]

# The plan: which rank, when, how, the phases' training configs and their bounds. Pure and
# validated before any container exists. A run has up to three phases, one job each, each in
# its own directory on the shared volume (rendezvous file, logs, flight dumps), so nothing of
# one phase leaks into the next:
#
# - ``reference`` (only with ``--recover``): an uninterrupted run of the same length and
#   settings;
# - ``fault``: the run whose rank ``rank`` is hit during step ``at_step``;
# - ``resume`` (only with ``--recover``): every rank restarts from the fault phase's newest
#   complete checkpoint, and goes on checkpointing as the uninterrupted run did.

DUMP_GRACE_S = 2.0  # ddp's survivors wait this long for the others' flight dumps
_STARTUP_S = 300.0  # containers import torch and meet at the rendezvous (2 shared cores)
_PER_STEP_S = 5.0  # the mini model's step is ~0.1 s; the rest is slack for a busy host
_SLACK_S = 90.0  # added to every bound derived from another
# The fault lands during a step: the sleep inside every step (before backward) is the time the
# injection has to land before the rank reaches that step's first allreduce.
DEFAULT_TRAIN = TrainConfig(
    steps=12,
    checkpoint_every=2,
    step_delay_ms=250.0,
    collective_timeout_s=30.0,
    checkpoint_dir=f"{job_dir('fault')}/logs/checkpoints",
)


def checkpoint_dir(phase: str) -> str:
    """Where ``phase`` writes checkpoints; the resumed run reads (and extends) the fault
    phase's, the only ones written before the fault."""
    return f"{job_dir('fault' if phase == 'resume' else phase)}/logs/checkpoints"


def default_run_timeout(train: TrainConfig) -> float:
    """Bound on an undisturbed phase (see :data:`RUN_TIMEOUT_HELP`)."""
    return _STARTUP_S + train.steps * (train.step_delay_ms / 1e3 + _PER_STEP_S) + _SLACK_S


def run_timeout(given: float | None, train: TrainConfig) -> float:
    """``--run-timeout`` as given (checked), else derived from ``train``: the bound on a
    phase, one rule for every path's plan (torchrun's and live's too)."""
    if given is None:
        return default_run_timeout(train)
    if not (math.isfinite(given) and given > 0):
        raise ValueError(f"--run-timeout must be > 0 seconds, got {given!r}")
    return given


RUN_TIMEOUT_HELP = (
    f"{_STARTUP_S:g} s start-up + steps x (step delay + {_PER_STEP_S:g} s) + {_SLACK_S:g} s, "
    f"i.e. {default_run_timeout(DEFAULT_TRAIN):g} s for {DEFAULT_TRAIN.steps} steps of "
    f"{DEFAULT_TRAIN.step_delay_ms:g} ms"
)


@dataclass(frozen=True)
class KillPlan:
    """One ``lab kill`` run. ``run_timeout_s`` None: derived from the training settings."""

    rank: int
    at_step: int
    mode: str
    train: TrainConfig = field(default_factory=lambda: DEFAULT_TRAIN)
    nodes: int = 4
    recover: bool = False
    run_timeout_s: float | None = None
    image: str = DEFAULT_IMAGE
    runs_dir: Path = Path("runs")
    progress: bool = True
    phases: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        if self.mode not in FAULTS:
            raise ValueError(f"--mode must be one of {', '.join(FAULTS)}, got {self.mode!r}")
        if self.nodes < 2:  # a fault needs at least one survivor to notice it
            raise ValueError(f"--nodes must be >= 2 (one to hit, one to notice), got {self.nodes}")
        if not 0 <= self.rank < self.nodes:
            raise ValueError(
                f"--rank {self.rank} is out of range: {self.nodes} nodes run ranks "
                f"0..{self.nodes - 1} (one rank per node)"
            )
        steps = self.train.steps
        if not 1 <= self.at_step <= steps:
            raise ValueError(
                f"--at-step {self.at_step} is outside the run: it trains steps 1..{steps}; "
                "pick one of them or raise --steps"
            )
        self.train.local_batch(self.nodes)  # the batch must split evenly over the ranks
        every = self.train.checkpoint_every
        if self.recover and every == 0:
            raise ValueError(
                "--recover needs checkpoints to resume from: pass --checkpoint-every K "
                f"with K < --at-step ({self.at_step})"
            )
        if self.recover and self.at_step <= every:
            raise ValueError(
                f"--recover: no checkpoint exists before the fault (the first is written after "
                f"step {every}, the fault lands in step {self.at_step}); use "
                f"--checkpoint-every < {self.at_step} or a later --at-step"
            )
        object.__setattr__(self, "run_timeout_s", run_timeout(self.run_timeout_s, self.train))
        phases = ("reference", "fault", "resume") if self.recover else ("fault",)
        object.__setattr__(self, "phases", phases)

    @property
    def fault(self) -> type[Fault]:
        return FAULTS[self.mode]

    @property
    def layout(self) -> Layout:
        return Layout(self.nodes, 1)  # one rank per node: a fault hits exactly one rank

    @property
    def node(self) -> int:
        return self.layout.node_of(self.rank)

    @property
    def survivors(self) -> list[int]:
        """Ranks expected to notice the fault and exit on their own."""
        everyone = range(self.layout.world_size)
        return [r for r in everyone if r != self.rank or self.fault.TARGET_NOTICES]

    @property
    def notice_timeout_s(self) -> float:
        """How long after the injection the survivors may take to exit with a diagnosis: the
        collective timeout, ddp's grace for the others' dumps, and slack for a busy host."""
        return self.train.collective_timeout_s + DUMP_GRACE_S + _SLACK_S

    @property
    def fault_job_timeout_s(self) -> float:
        """The fault phase's bound inside the nodes: up to the injection, then the notice."""
        assert self.run_timeout_s is not None
        return self.run_timeout_s + self.notice_timeout_s

    @property
    def lifetime_s(self) -> float:
        """The containers' main process outlives every phase, and no longer: a lab that died
        without cleaning up leaves nothing running for good."""
        assert self.run_timeout_s is not None
        total = self.fault_job_timeout_s + (2 * self.run_timeout_s if self.recover else 0)
        return math.ceil(total + 180.0)

    def triggers(self, event: Event) -> bool:
        """Whether ``event`` is the moment to inject: the target rank's record of step
        ``at_step - 1``, or its set-up record when the fault is aimed at step 1. Records, not
        the wording of ddp's lines, so rewording a line cannot stop the injection."""
        if not isinstance(event, RecordEvent) or event.rank != self.rank:
            return False
        if self.at_step == 1:
            return isinstance(event.record, ConfigRecord)
        return isinstance(event.record, StepRecord) and event.record.step == self.at_step - 1

    def config(self, phase: str) -> TrainConfig:
        """The training config of ``phase``: the same settings in every phase, only where
        checkpoints go and whether to resume differ."""
        if phase not in self.phases:
            raise ValueError(f"phase must be one of {', '.join(self.phases)}, got {phase!r}")
        changes: dict = {"checkpoint_dir": None, "resume": phase == "resume"}
        if self.train.checkpoint_every or phase == "resume":
            changes["checkpoint_dir"] = checkpoint_dir(phase)
        return self.train.replace(**changes)

    def describe(self) -> str:
        t = self.train
        return (
            f"{self.layout.describe()}, model {t.model}, {t.steps} steps ({t.step_delay_ms:g} ms "
            f"step delay), collective timeout {t.collective_timeout_s:g} s, checkpoint every "
            f"{t.checkpoint_every or 'never'}; fault: {self.mode} rank {self.rank} in step "
            f"{self.at_step}{', then recover' if self.recover else ''}"
        )


# What a run hands to its report: plain data, so the report is built and tested from
# synthetic values as well as from a real run.


@dataclass(frozen=True)
class Injection:
    """Lab's record of the fault: what it did and when (host ``time.time()``)."""

    mode: str
    rank: int
    node: int
    trigger: str  # what lab saw, e.g. "rank 2 reported step 4 done"
    trigger_time: float  # when that record arrived
    start: float  # just before the Docker call
    end: float  # when it returned: the fault is in place
    detail: str = ""  # e.g. the addresses a partition cut off


@dataclass
class PhaseOutcome:
    """How one phase's ranks ended: exits, and the failures (diagnoses) they reported."""

    name: str
    started: float  # host time the job was started
    exits: dict[int, ExitEvent] = field(default_factory=dict)
    failures: dict[int, tuple[float, FailureRecord]] = field(default_factory=dict)  # rank ->
    # (arrival time, record)

    @property
    def codes(self) -> dict[int, int]:
        return {r: e.code for r, e in sorted(self.exits.items())}


@dataclass
class KillResult:
    plan: KillPlan
    run_id: str
    run_dir: Path
    phases: dict[str, PhaseOutcome]
    injection: Injection | None
    dumps: dict[int, dict]  # the fault phase's flight dumps, by rank
    logs: dict[
        str, dict[int, RankLog]
    ]  # phase -> rank -> its records (ddp.program.records.load_run)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0  # containers created to removed


# The run: one cluster for every phase, one training job per phase, the fault injected when
# the target rank's records say it is time.
#
# The cluster's context manager collects every job into ``runs/<run-id>/<phase>/`` and removes
# everything labelled with the run id, also on errors and Ctrl-C; the fault's own context
# manager exits first, so whatever it left (a paused container, iptables rules) is released
# before the logs are collected and the containers removed. Between phases every node gets a
# fresh main process (:meth:`Cluster.restart`): no rank of one phase survives into the next.

_FAIL_GRACE_S = 10.0  # after a rank fails, how long the others get to say what they saw
_EXIT_AFTER_RELEASE_S = 30.0  # a released rank's container stream ends within this
_Echo = Callable[[str], None]


class _Follower:
    """A phase's echo: rank lines under one prefix, rank 0's steps as progress, and the
    failure records with the time they arrived."""

    def __init__(self, name: str, plan: KillPlan, echo: _Echo) -> None:
        self.name = name
        self.progress = Progress(plan.train.steps, enabled=plan.progress, echo=echo)
        self.failures: dict[int, tuple[float, FailureRecord]] = {}

    def __call__(self, event: Event) -> None:
        if isinstance(event, LineEvent):
            who = f"node{event.node}" if event.rank is None else f"rank{event.rank}"
            self.progress.write(f"[{self.name} {who}] {tidy_line(event.text)}")
        elif isinstance(event, RecordEvent):
            if isinstance(event.record, FailureRecord):
                self.failures.setdefault(event.rank, (event.t, event.record))
            elif isinstance(event.record, StepRecord) and event.rank == 0:
                self.progress.update(event.record.step)

    def outcome(self, job: Job) -> PhaseOutcome:
        self.progress.close()
        return PhaseOutcome(self.name, job.started, dict(job.exits), dict(self.failures))


def _failed(name: str, job: Job, what: str) -> NodeFailed:
    rank = min((r for r, c in job.codes.items() if c != 0), key=lambda r: job.exits[r].t)
    return NodeFailed(
        f"{name} phase: rank {rank} exited with code {job.codes[rank]} {what}; exit codes "
        f"{job.codes}; its last lines:\n{job.last_lines(rank, 12)}"
    )


def _undisturbed(cluster: Cluster, plan: KillPlan, name: str, echo: _Echo) -> PhaseOutcome:
    """Run a phase to its end; every rank must exit 0 (parity holds)."""
    start = ", from the newest checkpoint of the fault phase" if name == "resume" else ""
    echo(f"== {name}: {plan.train.steps} steps{start} (logs in {job_dir(name)}/logs)")
    follower = _Follower(name, plan, echo)
    assert plan.run_timeout_s is not None
    job = cluster.train(name, plan.config(name), plan.run_timeout_s, echo=follower)
    # The launcher stops its ranks at the run timeout; a little longer here sees them go.
    running = job.wait(plan.run_timeout_s + 15, fail_grace_s=_FAIL_GRACE_S)
    job.close()
    if any(c != 0 for c in job.codes.values()):
        raise _failed(name, job, "in an undisturbed phase")
    if running:
        tails = "\n".join(f"  rank {r}:\n{job.last_lines(r)}" for r in running)
        raise RunTimeout(
            f"{name} phase did not finish within --run-timeout {plan.run_timeout_s:g} s; ranks "
            f"still running: {running}. Last lines:\n{tails}\nRaise --run-timeout on a busy host"
        )
    return follower.outcome(job)


def _fault_phase(
    cluster: Cluster, plan: KillPlan, fault: Fault, echo: _Echo
) -> tuple[PhaseOutcome, Injection, list[str]]:
    prev = plan.at_step - 1
    when, goal = (
        (f"reports step {prev} done", f"report step {prev} done")
        if prev
        else ("is set up", "get set up")
    )
    echo(
        f"== fault: {plan.mode} rank {plan.rank} (node{plan.node}) as soon as it {when}, so the "
        f"fault lands in step {plan.at_step} (logs in {job_dir('fault')}/logs)"
    )
    follower = _Follower("fault", plan, echo)
    job = cluster.train("fault", plan.config("fault"), plan.fault_job_timeout_s, echo=follower)
    assert plan.run_timeout_s is not None
    trigger = None
    for event in job.events(plan.run_timeout_s):
        if isinstance(event, ExitEvent):
            raise _failed("fault", job, "before the fault was injected")
        if plan.triggers(event):
            trigger = event
            break
    if trigger is None:
        raise RunTimeout(
            f"rank {plan.rank} did not {goal} within --run-timeout {plan.run_timeout_s:g} s; "
            f"its last lines:\n{job.last_lines(plan.rank)}"
        )
    # Inject before handling any further event: the target is sleeping in step S's delay now.
    start = time.time()
    fault.inject()
    end = time.time()
    said = f"rank {plan.rank} reported step {prev} done" if prev else f"rank {plan.rank} set up"
    injection = Injection(
        plan.mode, plan.rank, plan.node, said, trigger.t, start, end, fault.detail
    )
    follower.progress.write(
        f"[lab] {end - job.started:+.2f} s: {plan.mode} rank {plan.rank} (node{plan.node}), "
        f"the Docker call took {end - start:.3f} s"
    )
    notes = []
    running = job.wait(plan.notice_timeout_s, ranks=plan.survivors)
    if running:
        notes.append(
            f"ranks {running} were still running {plan.notice_timeout_s:g} s after the fault "
            "(collective timeout + dump grace + slack)"
        )
    released = fault.release()  # the survivors are done: now a paused rank may go
    if released:
        notes.append(released)
    job.wait(_EXIT_AFTER_RELEASE_S)
    job.close()
    return follower.outcome(job), injection, notes


def run(plan: KillPlan, echo: _Echo = print) -> KillResult:
    """Run every phase of ``plan`` on one cluster; collect; always clean up."""
    client = connect()
    started = time.monotonic()
    cluster = Cluster(
        client,
        plan.layout,
        image=plan.image,
        lifetime_s=plan.lifetime_s,
        net_admin=plan.fault.NET_ADMIN,
        echo=echo,
    )
    cluster.run_dir = run_dir = plan.runs_dir / cluster.run_id
    echo(f"run {cluster.run_id}: {plan.describe()}; image {plan.image}; output in {run_dir}/")
    phases: dict[str, PhaseOutcome] = {}
    injection, notes = None, []
    # The fault is the inner context: it is released before the cluster collects and removes.
    with cluster, plan.fault() as fault:
        for i, name in enumerate(plan.phases):
            if i:  # nothing of the last phase runs on (a killed node starts again)
                for node in cluster.nodes:
                    cluster.restart(node.index)
            if name == "fault":
                fault.prepare(cluster, plan.node)
                phases[name], injection, notes = _fault_phase(cluster, plan, fault, echo)
            else:
                phases[name] = _undisturbed(cluster, plan, name, echo)
    return KillResult(
        plan,
        cluster.run_id,
        run_dir,
        phases,
        injection,
        load_dumps(run_dir / "fault" / "logs" / "flight"),
        {name: load_run(run_dir / name / "logs") for name in phases},
        notes,
        time.monotonic() - started,
    )


# The analysis, built from what the run collected: pure, tested without Docker.
# :func:`analyse` turns the result into the one :class:`RestartSummary` that ``report.json``,
# the console text and the page are built from.
#
# Inputs: the fault phase's outcome (exit events, the failure records the ranks wrote), the
# flight recorder dumps they left on the shared volume and lab's own record of the injection.
# Containers share the host's clock, so the dumps' stamps and lab's sit on one timeline.
#
# The diagnosis is ddp's (:func:`ddp.flight.diagnosis.diagnose` over the dumps); lab adds what
# only it knows, which rank it hit and how, and checks that the diagnosis names that rank.

PEER_FAILURE_EXIT = 3  # ddp train's exit code when a peer died, stalled or was cut off
HEADINGS = (
    "rank",
    "node",
    "role",
    "stuck in (collective, step, seq)",
    "waited in it",
    "noticed after fault",
    "what it saw",
    "exit code",
)


@dataclass
class RankRow:
    rank: int
    node: int
    role: str  # "survivor", or what lab did to it
    exit_code: int | None
    stuck_in: str | None  # the collective it was blocked in when it failed or dumped
    waited_s: float | None  # from entering that collective to its failure
    noticed_after_s: float | None  # from lab's fault call to that failure
    saw: str  # the raw error by its meaning, e.g. "the peer closed the connection"
    error: str | None  # the raw error, for report.json
    reported_missing: list[int] | None  # the missing ranks in its failure record

    def cells(self) -> list[str]:
        code = "-" if self.exit_code is None else str(self.exit_code)
        return [
            str(self.rank),
            f"node{self.node}",
            self.role,
            self.stuck_in or "-",
            fmt_s(self.waited_s),
            fmt_s(self.noticed_after_s),
            self.saw or "-",
            code,
        ]


@dataclass
class FaultReport:
    diagnosis: Diagnosis
    ok: bool
    last_line: str  # the closing "diagnosis: ..." line
    rows: list[RankRow]
    timeline: list[tuple[float, str]]  # (seconds since the fault phase started, event)
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """Timeline, per-rank table, notes; one prefix per line (the closing line apart)."""
        out = ["timeline of the fault phase (seconds since its ranks were started):"]
        out += [f"  {t:+8.2f} s  {what}" for t, what in self.timeline]
        out.append("ranks in the fault phase:")
        out += table(HEADINGS, [r.cells() for r in self.rows])
        out += [f"note: {n}" for n in self.notes]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "last_line": self.last_line,
            "diagnosis": asdict(self.diagnosis),
            "ranks": [asdict(r) for r in self.rows],
            "timeline": [{"t_s": round(t, 4), "event": e} for t, e in self.timeline],
            "notes": self.notes,
        }


def _describe(rec: dict) -> str:
    what = rec.get("op") or "collective"
    if rec.get("bucket") is not None:
        what += f" of bucket {rec['bucket']}"
    step = rec.get("step")
    where = f"step {step}" if isinstance(step, int) and step >= 0 else "setup"
    return f"{what}, {where}, seq {rec['seq']}"


def _stuck_record(dump: dict) -> dict | None:
    """The collective a rank was stuck in: its failed one, else its oldest unfinished one."""
    records = dump.get("records", [])
    failed = [r for r in records if r.get("state") == "failed"]
    if failed:
        return min(failed, key=lambda r: r["seq"])
    started = [r for r in records if r.get("state") == "started"]
    return min(started, key=lambda r: r["seq"]) if started else None


def build_report(
    plan: KillPlan,
    phase: PhaseOutcome,
    injection: Injection | None,
    dumps: dict[int, dict],
    notes: list[str] | None = None,
) -> FaultReport:
    """Compare the dumps (ddp's diagnosis), lay every event on one timeline, judge the result."""
    diag = diagnose(dumps, plan.layout.world_size)
    notes = list(notes or [])
    events: list[tuple[float, str]] = []

    def at(t: float, what: str) -> None:
        events.append((t - phase.started, what))

    if injection is not None:
        _injected(plan, injection, at)
    rows = [
        _rank_row(plan, phase, injection, dumps, diag, rank, at)
        for rank in range(plan.layout.world_size)
    ]
    events.sort(key=lambda e: e[0])
    ok, last = _judge(plan, diag, injection, phase, notes)
    return FaultReport(diag, ok, last, rows, events, notes)


def _injected(plan: KillPlan, injection: Injection, at: Callable[[float, str], None]) -> None:
    at(injection.trigger_time, injection.trigger)
    took = f"the Docker call took {injection.end - injection.start:.3f} s"
    detail = f"{injection.detail}; {took}" if injection.detail else took
    # Stamped when lab issued the call: the fault takes effect somewhere before it returns
    # (docker kill returns once the container is gone, its peers may have noticed first).
    at(
        injection.start,
        f"FAULT: rank {plan.rank} (node{injection.node}) {plan.fault.ROLE} ({detail})",
    )


def _rank_row(
    plan: KillPlan,
    phase: PhaseOutcome,
    injection: Injection | None,
    dumps: dict[int, dict],
    diag: Diagnosis,
    rank: int,
    at: Callable[[float, str], None],
) -> RankRow:
    """One rank's row; its events (entered, gave up, failure record, exit) go to ``at``."""
    rec = _stuck_record(dumps[rank]) if rank in dumps else None
    waited = noticed = None
    saw = ""
    if rec is not None and rec.get("seq") == diag.stuck_seq:
        at(rec["start"], f"rank {rank} entered {_describe(rec)}")
    if rec is not None and rec.get("state") == "failed" and rec.get("end") is not None:
        waited = max(0.0, rec["end"] - rec["start"])
        noticed = rec["end"] - injection.start if injection is not None else None
        saw = error_meaning(rec.get("error"))
        at(
            rec["end"],
            f"rank {rank} gave up on {_describe(rec)} after {fmt_s(waited)}"
            + (f": {saw}" if saw else ""),
        )
    failure = phase.failures.get(rank)
    if failure is not None:
        t, record = failure
        named = ",".join(map(str, record.missing_ranks)) or "none"
        at(t, f"rank {rank} wrote its failure record (missing ranks: {named})")
    if rank in phase.exits:
        at(phase.exits[rank].t, f"rank {rank} exited with code {phase.exits[rank].code}")
    return RankRow(
        rank,
        plan.layout.node_of(rank),
        f"{plan.fault.ROLE} by lab" if rank == plan.rank else "survivor",
        phase.exits[rank].code if rank in phase.exits else None,
        _describe(rec) if rec else None,
        waited,
        noticed,
        saw,
        rec.get("error") if rec else None,
        failure[1].missing_ranks if failure is not None else None,
    )


def _judge(
    plan: KillPlan,
    diag: Diagnosis,
    injection: Injection | None,
    phase: PhaseOutcome,
    notes: list[str],
) -> tuple[bool, str]:
    """The closing line, and whether the diagnosis names the rank lab actually hit."""
    if injection is None:
        return False, f"no diagnosis: the fault was never injected into rank {plan.rank}"
    if diag.stuck_seq is None:
        return (
            False,
            f"no diagnosis: no rank left a record of a stuck collective ({diag.summary()})",
        )
    codes = phase.codes
    quiet = [r for r in plan.survivors if codes.get(r) != PEER_FAILURE_EXIT]
    if quiet:
        notes.append(
            f"ranks {quiet} did not exit with ddp's peer-failure code {PEER_FAILURE_EXIT} "
            f"(exit codes: {codes})"
        )
    unreported = [r for r in plan.survivors if r not in phase.failures]
    if unreported and not quiet:
        notes.append(f"ranks {unreported} exited without a failure record")
    if diag.step is not None and diag.step != plan.at_step:
        when = "late" if diag.step > plan.at_step else "early"
        notes.append(
            f"the fault was aimed at step {plan.at_step} but the stuck collective is in step "
            f"{diag.step}: the injection landed {when} (raise --step-delay-ms on a busy host)"
        )
    if plan.fault.TARGET_NOTICES:
        # A partition: the cut-off rank is alive and arrives like everyone else, so the dumps
        # show a collective every rank entered and none finished. Only lab knows whose link
        # it cut.
        ok = not [r for r in diag.missing_ranks if r != plan.rank]
        where = f"step {diag.step}" if diag.step is not None and diag.step >= 0 else "setup"
        what = (
            f"{diag.op or 'collective'}"
            + (f" of bucket {diag.bucket}" if diag.bucket is not None else "")
            + f", seq {diag.stuck_seq}"
        )
        seen = (
            "every rank arrived, none completed"
            if not diag.missing_ranks
            else f"missing per the dumps: {diag.missing_ranks}"
        )
        return (
            ok,
            f"diagnosis: rank {plan.rank} {plan.fault.ROLE} from the network at {where} "
            f"({what}): {seen}{_noticed(diag)}",
        )
    ok = diag.missing_ranks == [plan.rank]
    line = f"diagnosis: {diag.summary()}"
    if not ok:
        line += f" (but lab {plan.fault.ROLE} rank {plan.rank})"
    return ok, line


def _noticed(diag: Diagnosis) -> str:
    if not diag.noticed:
        return ""
    times = sorted(diag.noticed.values())
    lo, hi = fmt_s(times[0])[:-2], fmt_s(times[-1])[:-2]
    ranks = ",".join(str(r) for r in sorted(diag.noticed))
    word = "rank" if len(diag.noticed) == 1 else "ranks"
    return f"; {word} {ranks} noticed after {lo if lo == hi else f'{lo}-{hi}'} s"


# Did ``--recover`` lose anything? The final parameters, compared bit for bit. Every rank
# that finishes writes an end record with the sha256 of all its parameter bytes
# (:class:`ddp.program.records.EndRecord`), so the resumed run and an uninterrupted run of the
# same length and settings are identical iff those digests are equal on every rank. Pure:
# reads the collected logs only (:func:`ddp.program.records.load_run`).

IDENTICAL = "recovered: final parameters bitwise identical to an uninterrupted run"


@dataclass
class Recovery:
    ok: bool
    last_line: str
    resumed_from: int | None  # the checkpoint step every resumed rank started after
    details: list[str] = field(default_factory=list)  # per rank, or what is missing


def compare_runs(
    reference: dict[int, RankLog], resumed: dict[int, RankLog], world_size: int
) -> Recovery:
    """Bitwise comparison of every rank's final parameters between the uninterrupted run
    (``reference``) and the resumed one, as read by :func:`ddp.program.records.load_run`."""
    starts = {log.config.start_step for log in resumed.values() if log.config is not None}
    resumed_from = starts.pop() if len(starts) == 1 else None
    problems: list[str] = []
    shas: dict[str, dict[int, str]] = {"uninterrupted": {}, "resumed": {}}
    for name, logs in (("uninterrupted", reference), ("resumed", resumed)):
        for rank in range(world_size):
            log = logs.get(rank)
            end = log.end if log is not None else None
            if end is None or not end.params_sha256:
                problems.append(f"the {name} run has no end record for rank {rank}")
                continue
            shas[name][rank] = end.params_sha256
            if not end.parity:
                problems.append(f"the {name} run ended with parity broken (rank {rank})")
    if problems:
        return Recovery(
            False, "recovered: cannot compare: " + "; ".join(problems), resumed_from, problems
        )
    ref, res = shas["uninterrupted"], shas["resumed"]
    differ = [r for r in range(world_size) if ref[r] != res[r]]
    if not differ:
        same = [f"rank {r} {res[r][:12]}.. = {ref[r][:12]}.." for r in range(world_size)]
        return Recovery(True, IDENTICAL, resumed_from, same)
    details = [f"rank {r} {res[r][:12]}.. != {ref[r][:12]}.." for r in differ]
    return Recovery(
        False,
        f"recovered, but the final parameters DIFFER from an uninterrupted run on ranks "
        f"{','.join(map(str, differ))} ({details[0]})",
        resumed_from,
        details,
    )


@dataclass
class RestartSummary:
    """The fault report and, with ``--recover``, the recovery check; and the run they came
    from."""

    result: KillResult
    report: FaultReport
    recovery: Recovery | None

    @property
    def ok(self) -> bool:
        """The diagnosis names the rank that was hit (and the recovery is bitwise identical)."""
        return self.report.ok and (self.recovery is None or self.recovery.ok)


def analyse(result: KillResult) -> RestartSummary:
    plan = result.plan
    report = build_report(
        plan, result.phases["fault"], result.injection, result.dumps, result.notes
    )
    recovery = None
    if plan.recover:
        recovery = compare_runs(
            result.logs.get("reference", {}),
            result.logs.get("resume", {}),
            plan.layout.world_size,
        )
    return RestartSummary(result, report, recovery)


# What is printed after the run, from its summary: the fault report, the recovery check, and
# last the diagnosis (and the recovery's verdict). Pure.


def lines(summary: RestartSummary) -> list[str]:
    """The report, then the closing lines: the diagnosis, and with --recover the recovery."""
    report, recovery = summary.report, summary.recovery
    out = report.lines()
    if recovery is not None:
        out.append(
            f"recovery: resumed from the checkpoint of step {recovery.resumed_from} (fault in "
            f"step {summary.result.plan.at_step}); sha256 of the final parameters, resumed vs "
            "uninterrupted: " + "; ".join(recovery.details)
        )
    out.append(report.last_line)
    if recovery is not None:
        out.append(recovery.last_line)
    return out


# ``report.json``: the plan, the injection, every phase's exits, the fault report and the
# recovery check.


def summary_dict(summary: RestartSummary) -> dict[str, Any]:
    result = summary.result
    plan = result.plan
    return {
        "run_id": result.run_id,
        "ok": summary.ok,
        "seconds": round(result.seconds, 3),
        "plan": {
            "rank": plan.rank,
            "at_step": plan.at_step,
            "mode": plan.mode,
            "nodes": plan.nodes,
            "recover": plan.recover,
            "run_timeout_s": plan.run_timeout_s,
            "image": plan.image,
            "train": plan.train.to_dict(),
        },
        "injection": asdict(result.injection) if result.injection else None,
        "phases": {
            name: {"started": ph.started, "exit_codes": {str(r): c for r, c in ph.codes.items()}}
            for name, ph in result.phases.items()
        },
        "fault": summary.report.to_dict(),
        "recovery": asdict(summary.recovery) if summary.recovery else None,
    }


def write_files(summary: RestartSummary) -> list[Path]:
    path = summary.result.run_dir / "report.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary_dict(summary), indent=2, default=str))
    return [path]


# The page: the diagnosis as the headline (``rank 2 missing at step 5``), the fault phase's
# timeline, the per-rank table (what each survivor was stuck in, when it noticed, what it
# saw), the recovery check, and every phase's ranks. From the run's summary.

_FILES = [
    ("report.json", "the plan, the injection, every phase's exits, the checks"),
    ("fault/logs/flight/", "the fault phase's flight recorder dumps"),
]


def page(summary: RestartSummary) -> Results:
    report, recovery = summary.report, summary.recovery
    timeline = Table(
        ("s since the fault phase started", "event"),
        [[f"{t:+.2f}", what] for t, what in report.timeline],
    )
    sections = [
        Section("Timeline of the fault phase", [timeline]),
        Section(
            "Ranks in the fault phase",
            [
                Table(HEADINGS, [r.cells() for r in report.rows]),
                Text([f"note: {n}" for n in report.notes]),
            ],
        ),
    ]
    verdict = report.last_line
    if recovery is not None:
        sections.append(Section("Recovery", [Text([*recovery.details, recovery.last_line])]))
        verdict += f"; {recovery.last_line}"
    diag = report.diagnosis
    figure = key_figure(diag.summary()) if diag.stuck_seq is not None else "no diagnosis"
    result = summary.result
    phases = {name: ph.codes for name, ph in result.phases.items()}
    run = (result.run_id, result.run_dir, result.seconds)
    return kill_page(run, sections, phases, (verdict, figure, summary.ok), _FILES)


def report(result: KillResult) -> int:
    """Exit 0 when the diagnosis names the rank that was hit (and, with --recover, the
    resumed run ended bitwise identical to the uninterrupted one)."""
    summary = analyse(result)
    write_files(summary)
    made = page(summary)
    for line in publish(result.run_dir, made.page, made.summary, made.files, made.jobs):
        print(line)
    print("\n".join(lines(summary)))
    return 0 if summary.ok else 1
