"""``lab kill --launcher torchrun``: one worker process SIGKILLed (or, ``--mode host``, a
host's nodes taken away), torchrun's agent restarts the worker group, the workers resume from
the newest checkpoint by themselves; compared with an uninterrupted run of the same job.

One module, read top to bottom in the order data flows: the plan (pure, validated), the
result, the run on the engine, the restart read back (the timeline, the final parameters
compared) and the judge (pure: one :class:`TorchrunSummary`), then ``report.json`` and the
page, each from that summary alone (the console text is the verdict's lines); last
:func:`report`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ddp.torchfree import (
    ConfigRecord,
    RankLog,
    Section,
    StepRecord,
    Table,
    Text,
    TrainConfig,
    VerdictRecord,
    load_attempts,
    load_run,
)
from lab.engine.client import LabError, NodeFailed, RunTimeout, connect
from lab.engine.cluster import Cluster
from lab.engine.events import Event, ExitEvent, LineEvent, RecordEvent
from lab.engine.job import Job
from lab.engine.layout import Layout
from lab.engine.specs import DEFAULT_IMAGE, job_dir
from lab.engine.training import Torchrun
from lab.experiments.kill.restart import DEFAULT_TRAIN, run_timeout
from lab.experiments.kill.shared import kill_page
from lab.faults.host import HostDown
from lab.progress import Progress, follow_steps
from lab.report.publish import publish
from lab.report.results import Results

__all__ = [
    "PHASES",
    "PS_ARGV",
    "Check",
    "JobOutcome",
    "Recovered",
    "TorchrunKillPlan",
    "TorchrunKillResult",
    "TorchrunSummary",
    "Verdict",
    "WorkerKill",
    "analyse",
    "compare_final",
    "compare_survivors",
    "judge",
    "page",
    "report",
    "restart_timeline",
    "run",
    "worker_pids",
    "write_files",
]

# The plan: kill one worker process, let torchrun recover. Pure and validated before any
# container exists. One torchrun per node (``--nodes`` x ``--procs-per-node`` workers,
# ``--max-restarts`` restarts of the worker group); two jobs on the same containers, each with
# its own directory (logs, checkpoints) on the shared volume:
#
# - ``reference``: an uninterrupted run of the same training config;
# - ``fault``: the run in which rank ``rank``'s worker process (not its container: the agent
#   must survive to see it) is SIGKILLed when that rank reports step ``at_step - 1``, so the
#   kill lands in step ``at_step``. torchrun's agent restarts the worker group with the same
#   command line, and ``--auto-resume`` makes the new workers continue from the newest
#   complete checkpoint in the job's directory.
#
# ``--mode host`` (across ``--hosts``) takes a whole host away instead, every container on it
# killed at once (:class:`lab.faults.host.HostDown`), when rank 0 reports step ``at_step - 1``.
# The agents run ``--nnodes MIN:MAX`` with MIN the nodes left, so the survivors re-rendezvous
# as a smaller world, which starts fresh (``--checkpoint-every 0``): rank 0 alone writes
# checkpoints, so they may have gone with the host, and they hold another world's run.
#
# Only what torchrun can recover is offered: ``--mode kill`` and ``host`` (a paused worker is
# no failure to the agent, and a worker shares its container's network, so one cannot be cut
# off alone), and no ``--recover`` (torchrun restarts the workers itself; that is the
# experiment).

PHASES = ("reference", "fault")
_MODES = ("kill", "host")
_CONTAINER_SLACK_S = 180.0  # the containers outlive both jobs by this much


@dataclass(frozen=True)
class TorchrunKillPlan:
    """One ``lab kill --launcher torchrun`` run. ``run_timeout_s`` None: derived from the
    training settings (as for ``lab kill``); it bounds the reference job and each attempt of
    the faulted one (before the fault, and after the restart)."""

    rank: int
    at_step: int
    train: TrainConfig = field(default_factory=lambda: DEFAULT_TRAIN)
    nodes: int = 2
    procs_per_node: int = 2
    max_restarts: int = 1
    mode: str = "kill"
    lost: tuple[int, ...] = ()  # --mode host: the nodes on the host taken away
    recover: bool = False
    run_timeout_s: float | None = None
    image: str = DEFAULT_IMAGE
    runs_dir: Path = Path("runs")
    progress: bool = True

    def __post_init__(self) -> None:
        if self.mode not in _MODES:
            raise ValueError(
                f"--launcher torchrun supports --mode kill or host, got --mode {self.mode}: "
                "torchrun restarts workers that die; a paused worker is no failure to its "
                "agent, and a worker shares its container's network, so it cannot be cut off "
                "alone (use --launcher file for pause and partition)"
            )
        if self.recover:
            raise ValueError(
                "--recover does not go with --launcher torchrun: torchrun's agent restarts the "
                "workers itself and they resume from the newest checkpoint; drop --recover"
            )
        if self.max_restarts < 1:
            raise ValueError(
                f"--max-restarts {self.max_restarts}: torchrun would give up at the first "
                "failure; pass --max-restarts 1 or more"
            )
        if self.mode == "host":
            self._check_host()
        self.launch  # noqa: B018 - validates --nodes, --procs-per-node, --max-restarts
        world = self.layout.world_size
        if not 0 <= self.rank < world:
            raise ValueError(
                f"--rank {self.rank} is out of range: {self.nodes} nodes x "
                f"{self.procs_per_node} workers run ranks 0..{world - 1}"
            )
        steps, every = self.train.steps, self.train.checkpoint_every
        if not 1 <= self.at_step <= steps:
            raise ValueError(
                f"--at-step {self.at_step} is outside the run: it trains steps 1..{steps}; "
                "pick one of them or raise --steps"
            )
        if self.mode == "kill" and not 1 <= every < self.at_step:
            raise ValueError(
                f"--launcher torchrun: the restarted workers resume from a checkpoint, and "
                f"none exists before the fault with --checkpoint-every {every} (the fault "
                f"lands in step {self.at_step}); pass 1 <= --checkpoint-every < "
                f"{self.at_step} or a later --at-step"
            )
        self.train.local_batch(world)  # the batch must split evenly over the ranks
        self.config("fault")  # validates the jobs' config before any container exists
        object.__setattr__(self, "run_timeout_s", run_timeout(self.run_timeout_s, self.train))

    def _check_host(self) -> None:
        if not 0 < len(self.lost) < self.nodes or not set(self.lost) <= set(range(self.nodes)):
            raise ValueError(
                f"--mode host: the host's nodes {list(self.lost)} must be some, not all, of "
                f"the {self.nodes} nodes; spread them with --hosts (and --placement)"
            )
        if self.at_step < 2 or self.train.checkpoint_every:
            raise ValueError(
                "--launcher torchrun --mode host: the survivors start a new world from step 0 "
                "(rank 0's checkpoints may go with the host, and were of another world) after "
                "rank 0 reports step --at-step - 1: pass --checkpoint-every 0 and --at-step 2 "
                f"or later (got {self.train.checkpoint_every} and {self.at_step})"
            )

    @property
    def launch(self) -> Torchrun:
        """``--mode host``: ``--nnodes MIN:MAX``, MIN the nodes that stay."""
        low = self.nodes - len(self.lost) if self.mode == "host" else None
        return Torchrun(
            self.nodes, self.procs_per_node, max_restarts=self.max_restarts, min_nodes=low
        )

    @property
    def survivors(self) -> int:
        """The ranks after the fault: every rank again, or those of the nodes that stay."""
        return (self.nodes - len(self.lost)) * self.procs_per_node

    @property
    def layout(self) -> Layout:
        """The containers; which rank runs where is torchrun's rendezvous's choice."""
        return Layout(self.nodes, self.procs_per_node)

    @property
    def phases(self) -> tuple[str, ...]:
        return PHASES

    def config(self, phase: str) -> TrainConfig:
        """A job's training config, the same settings in both: logs and checkpoints in the
        job's own directory on the shared volume, and a checkpoint there means resume (what
        a worker restarted with the same command line needs)."""
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {', '.join(PHASES)}, got {phase!r}")
        return self.train.replace(
            log_dir=f"{job_dir(phase)}/logs", checkpoint_dir=None, resume=False, auto_resume=True
        )

    @property
    def reference_timeout_s(self) -> float:
        assert self.run_timeout_s is not None
        return self.run_timeout_s

    @property
    def fault_timeout_s(self) -> float:
        """The faulted job: an attempt up to the fault, and one from the restart on."""
        assert self.run_timeout_s is not None
        return 2 * self.run_timeout_s

    @property
    def lifetime_s(self) -> float:
        """The containers' main process outlives both jobs, and no longer."""
        return math.ceil(self.reference_timeout_s + self.fault_timeout_s + _CONTAINER_SLACK_S)

    def triggers(self, event: Event) -> bool:
        """The moment to kill: rank ``rank``'s record of step ``at_step - 1`` (``at_step`` is
        at least 2: a checkpoint comes first). By ``record.rank``: under torchrun a node's
        stream carries several ranks."""
        record = getattr(event, "record", None)
        return (
            isinstance(event, RecordEvent)
            and isinstance(record, StepRecord)
            and (record.rank, record.step) == (self.rank, self.at_step - 1)
        )

    def describe(self) -> str:
        t = self.train
        if self.mode == "host":
            lost = ", ".join(f"node{n}" for n in self.lost)
            return (
                f"torchrun on {self.layout.describe().replace('rank', 'worker')}, --nnodes "
                f"{self.nodes - len(self.lost)}:{self.nodes}, max restarts {self.max_restarts}, "
                f"model {t.model}, {t.steps} steps ({t.step_delay_ms:g} ms step delay), no "
                f"checkpoint; fault: the host of {lost} goes away in step {self.at_step}"
            )
        return (
            f"torchrun on {self.layout.describe().replace('rank', 'worker')}, max restarts "
            f"{self.max_restarts}, model {t.model}, {t.steps} steps ({t.step_delay_ms:g} ms "
            f"step delay), checkpoint every {t.checkpoint_every}, auto-resume; fault: SIGKILL "
            f"rank {self.rank}'s worker process in step {self.at_step}"
        )


# What the run hands to its judge: the jobs' exits, lab's kill, the faulted job's typed
# events, the collected logs. Plain data, so the verdict is tested from synthetic values as
# well as from a real run.


@dataclass(frozen=True)
class WorkerKill:
    """Lab's kill of one worker process, or of a whole host's containers (``host``; then
    ``rank`` is the rank whose record triggered it and ``pid`` 0); times are ``time.time()``."""

    rank: int
    node: int
    pid: int  # in the node's pid namespace, from the rank's set-up record
    trigger: str  # what lab saw, e.g. "rank 3 reported step 4 done"
    trigger_time: float
    start: float  # just before the docker exec of kill
    end: float  # when it returned
    code: int  # kill's exit code in the node: 0, the signal was sent
    output: str = ""
    host: str = ""  # --mode host: what went, e.g. "host2 down: docker kill of node2 ..."

    @property
    def what(self) -> str:
        if self.host:
            return self.host
        return f"SIGKILL rank {self.rank}'s worker (pid {self.pid}) on node{self.node}"


@dataclass(frozen=True)
class JobOutcome:
    """How a torchrun job ended: torchrun's exit code per node, nodes still running."""

    name: str
    started: float
    ended: float | None  # the last exit
    codes: dict[int, int]
    running: list[int] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.running and bool(self.codes) and all(c == 0 for c in self.codes.values())

    @property
    def seconds(self) -> float | None:
        return None if self.ended is None else self.ended - self.started


@dataclass
class TorchrunKillResult:
    plan: TorchrunKillPlan
    run_id: str
    run_dir: Path
    reference: JobOutcome
    fault: JobOutcome
    kill: WorkerKill | None
    events: list[Event]  # the faulted job's, in arrival order
    logs: dict[str, dict[int, RankLog]]  # phase -> rank -> its newest attempt
    attempt_steps: dict[int, list[int]]  # fault phase: rank -> last step of each attempt
    seconds: float = 0.0  # containers created to removed


# The run: an uninterrupted torchrun job, then one whose worker of rank R is SIGKILLed, on the
# same containers; torchrun's agents do the rest.
#
# The kill is triggered by rank R's typed step record and aimed at the pid its set-up record
# gave (``ConfigRecord.pid``, in its container's pid namespace), on the node that record came
# from: torchrun's rendezvous, not lab, decides where a rank runs. After the kill nothing is
# raised: whatever torchrun made of it is handed to the judge. The cluster's context manager
# collects both jobs into ``runs/<run-id>/<job>/`` and removes everything labelled with the
# run id, also on errors and Ctrl-C.

_WAIT_SLACK_S = 15.0  # the node launcher stops torchrun at the job's timeout; seen within this
_Echo = Callable[[str], None]


class _Follower:
    """A job's echo: each node's lines under one prefix, rank 0's steps as progress, every
    event kept (the timeline is built from them), every rank's latest set-up record."""

    def __init__(self, name: str, plan: TorchrunKillPlan, echo: _Echo) -> None:
        self.name = name
        self.progress = Progress(plan.train.steps, enabled=plan.progress, echo=echo)
        self._steps = follow_steps(self.progress)
        self.events: list[Event] = []
        self.setup: dict[int, tuple[int, ConfigRecord]] = {}  # rank -> (node, record)

    def __call__(self, event: Event) -> None:
        self.events.append(event)
        if isinstance(event, LineEvent):
            self.progress.write(f"[{self.name} node{event.node}] {event.text}")
        elif isinstance(event, RecordEvent) and isinstance(event.record, ConfigRecord):
            self.setup[event.record.rank] = (event.node, event.record)
        self._steps(event)

    def outcome(self, job: Job) -> JobOutcome:
        self.progress.close()
        ended = max((e.t for e in job.exits.values()), default=None)
        return JobOutcome(self.name, job.started, ended, job.codes, job.running)


def _unfinished(job: Job, what: str) -> LabError:
    codes = job.codes
    if any(c != 0 for c in codes.values()):
        node = min((n for n, c in codes.items() if c != 0), key=lambda n: job.exits[n].t)
        return NodeFailed(
            f"{what}: torchrun on node{node} exited {codes[node]}; exit codes {codes}; its last "
            f"lines:\n{job.last_lines(node, 12)}"
        )
    tails = "\n".join(f"  node{n}:\n{job.last_lines(n)}" for n in job.running)
    return RunTimeout(f"{what}: nodes {job.running} still running. Last lines:\n{tails}")


def _started(
    cluster: Cluster, plan: TorchrunKillPlan, name: str, timeout: float, echo: _Echo
) -> tuple[Job, _Follower]:
    """Job ``name`` (its phase's config) under torchrun on every node, followed."""
    follower = _Follower(name, plan, echo)
    job = cluster.torchrun(name, plan.config(name), timeout, launch=plan.launch, echo=follower)
    return job, follower


def _reference(cluster: Cluster, plan: TorchrunKillPlan, echo: _Echo) -> JobOutcome:
    echo(
        f"== reference: {plan.train.steps} steps, uninterrupted "
        f"(logs in {job_dir('reference')}/logs)"
    )
    timeout = plan.reference_timeout_s
    job, follower = _started(cluster, plan, "reference", timeout, echo)
    job.wait(timeout + _WAIT_SLACK_S)
    job.close()
    outcome = follower.outcome(job)
    if not outcome.clean:
        raise _unfinished(job, f"reference job (within --run-timeout {timeout:g} s)")
    return outcome


def _host_down(
    fault: HostDown, plan: TorchrunKillPlan, follower: _Follower, trigger: RecordEvent
) -> WorkerKill:
    """Every container of the host at once; the ranks it took are those torchrun put there."""
    said = f"rank {plan.rank} reported step {plan.at_step - 1} done"
    start = time.time()
    fault.inject()
    end = time.time()
    ranks = sorted(r for r, (node, _) in follower.setup.items() if node in plan.lost)
    what = f"{fault.what} (ranks {ranks}, where torchrun put them)"
    return WorkerKill(plan.rank, plan.lost[0], 0, said, trigger.t, start, end, 0, "", what)


def _kill(
    cluster: Cluster, plan: TorchrunKillPlan, follower: _Follower, trigger: RecordEvent
) -> WorkerKill:
    if plan.rank not in follower.setup:
        raise LabError(f"rank {plan.rank} reported a step before its set-up record")
    node, setup = follower.setup[plan.rank]
    if setup.pid is None:
        raise LabError(
            f"rank {plan.rank}'s set-up record has no pid: the image's ddp predates it; "
            "rebuild the image with `python -m lab image`"
        )
    said = f"rank {plan.rank} reported step {plan.at_step - 1} done"
    start = time.time()
    code, out = cluster.exec(node, ["kill", "-9", str(setup.pid)])
    end = time.time()
    return WorkerKill(plan.rank, node, setup.pid, said, trigger.t, start, end, code, out)


def _faulted(
    cluster: Cluster, plan: TorchrunKillPlan, echo: _Echo
) -> tuple[JobOutcome, WorkerKill, list[Event]]:
    what = (
        f"take node{plan.lost[0]}'s host away"
        if plan.mode == "host"
        else f"SIGKILL rank {plan.rank}'s worker process"
    )
    echo(
        f"== fault: {what} as soon as rank {plan.rank} reports step {plan.at_step - 1}, then "
        f"torchrun restarts the workers (logs in {job_dir('fault')}/logs)"
    )
    timeout = plan.fault_timeout_s
    host = HostDown() if plan.mode == "host" else None
    if host is not None:
        host.prepare(cluster, plan.lost[0])
    job, follower = _started(cluster, plan, "fault", timeout, echo)
    trigger = None
    for event in job.events(plan.run_timeout_s):
        if isinstance(event, ExitEvent):
            raise _unfinished(job, "fault job, before the fault was injected")
        if plan.triggers(event):
            assert isinstance(event, RecordEvent)
            trigger = event
            break
    if trigger is None:
        raise RunTimeout(
            f"rank {plan.rank} did not report step {plan.at_step - 1} within --run-timeout "
            f"{plan.run_timeout_s:g} s; node messages:\n{job.last_lines(None)}"
        )
    # before any further event is handled
    if host is not None:
        kill = _host_down(host, plan, follower, trigger)
    else:
        kill = _kill(cluster, plan, follower, trigger)
    follower.progress.write(
        f"[lab] {kill.start - job.started:+.2f} s: {kill.what} (kill exited {kill.code}, the "
        f"Docker call took {kill.end - kill.start:.3f} s)"
    )
    job.wait(timeout - (time.time() - job.started) + _WAIT_SLACK_S)
    job.close()
    return follower.outcome(job), kill, follower.events


def run(plan: TorchrunKillPlan, echo: _Echo = print) -> TorchrunKillResult:
    """Both jobs on one cluster; collect; always clean up."""
    client = connect()
    started = time.monotonic()
    cluster = Cluster(client, plan.layout, image=plan.image, lifetime_s=plan.lifetime_s, echo=echo)
    cluster.run_dir = run_dir = plan.runs_dir / cluster.run_id
    echo(f"run {cluster.run_id}: {plan.describe()}; image {plan.image}; output in {run_dir}/")
    with cluster:
        reference = _reference(cluster, plan, echo)
        fault, kill, events = _faulted(cluster, plan, echo)
    attempts = load_attempts(run_dir / "fault" / "logs")
    return TorchrunKillResult(
        plan,
        cluster.run_id,
        run_dir,
        reference,
        fault,
        kill,
        events,
        {name: load_run(run_dir / name / "logs") for name in ("reference", "fault")},
        {
            r: [log.steps[-1].step if log.steps else 0 for log in logs]
            for r, logs in attempts.items()
        },
        time.monotonic() - started,
    )


# An elastic restart under torchrun, read back: which worker to kill, what happened when, and
# whether the resumed run ended where an uninterrupted one does.
#
# torchrun's agent restarts the whole worker group when one worker dies (``--max-restarts``);
# the new workers start with the same command line and ``--auto-resume`` continues from the
# newest complete checkpoint. The timeline is built from the job's typed events (records carry
# their rank, the host stamps their arrival): the fault, the agent's own report of the failure
# (its line, shown as it is and never interpreted), the restarted workers' first record and
# the step they resumed after, rank 0's first step and verdict, and every node's exit. The
# verdict on recovery compares every rank's final ``params_sha256`` with an uninterrupted
# run's, bitwise. Pure: the Docker side only hands over ``ps`` output and events.

PS_ARGV = ["ps", "-eo", "pid=,args="]  # what worker_pids reads, run in the node
_WORKER = " -u -m ddp train"  # how torchrun starts a worker: sys.executable -u -m ddp train
_AGENT_FAILED = "failed (exitcode"  # torchrun's line when it sees a worker die


def worker_pids(ps_output: str) -> list[int]:
    """The pids of torchrun's workers in ``ps -eo pid=,args=`` output, oldest first (the
    agent's own command line also says ``-m ddp train``, but without ``-u`` before it)."""
    pids = []
    for line in ps_output.splitlines():
        pid, _, args = line.strip().partition(" ")
        if pid.isdigit() and _WORKER in f" {args}" and "torchrun" not in args:
            pids.append(int(pid))
    return sorted(pids)


def restart_timeline(events: Iterable[Event], fault_t: float, fault: str) -> list[str]:
    """Lines ``+S.SS s  what`` (seconds from the fault) for the events of a restarted job."""
    moments: list[tuple[float, str]] = [(fault_t, f"fault: {fault}")]
    agent = resumed = first_step = None
    for e in events:
        if e.t < fault_t:
            continue
        if isinstance(e, LineEvent) and agent is None and _AGENT_FAILED in e.text:
            agent = e
            moments.append((e.t, f"node{e.node} agent: {e.text.split('] ', 1)[-1]}"))
        elif isinstance(e, RecordEvent) and isinstance(e.record, ConfigRecord) and not resumed:
            resumed = e
            moments.append(
                (
                    e.t,
                    f"workers restarted: rank {e.record.rank} (node{e.node}) set up, "
                    f"resuming after step {e.record.start_step}",
                )
            )
        elif isinstance(e, RecordEvent) and e.record.rank == 0:
            if isinstance(e.record, StepRecord) and resumed and first_step is None:
                first_step = e
                moments.append((e.t, f"rank 0 (node{e.node}) trains step {e.record.step}"))
            elif isinstance(e.record, VerdictRecord):
                moments.append((e.t, f"verdict: {e.record.message}"))
        elif isinstance(e, ExitEvent):
            moments.append((e.t, f"node{e.node}: torchrun exited {e.code}"))
    if resumed is None:
        moments.append((fault_t, "no worker restarted after the fault"))
    return [f"{t - fault_t:+8.2f} s  {what}" for t, what in sorted(moments, key=lambda m: m[0])]


@dataclass(frozen=True)
class Recovered:
    """Did the restarted run end bitwise where the uninterrupted one did?"""

    ok: bool
    line: str
    resumed_after: int | None  # the checkpoint step the last attempt started from
    bitwise: bool = True  # compared bitwise with the uninterrupted run (not after a lost host)


def compare_final(reference: Mapping[int, RankLog], resumed: Mapping[int, RankLog]) -> Recovered:
    """Every rank's final ``params_sha256`` and parity, resumed vs uninterrupted. Replicas are
    identical, so a rank that torchrun placed elsewhere after the restart still compares."""
    problems = []
    for name, logs in (("uninterrupted", reference), ("resumed", resumed)):
        for rank in sorted(set(reference) | set(resumed)):
            end = logs[rank].end if rank in logs else None
            if end is None:
                problems.append(f"the {name} run has no end record for rank {rank}")
            elif not end.parity:
                problems.append(f"the {name} run ended with parity broken (rank {rank})")
    starts = {log.config.start_step for log in resumed.values() if log.config is not None}
    after = starts.pop() if len(starts) == 1 else None
    if problems or not reference:
        why = "; ".join(problems) or "no ranks logged"
        return Recovered(False, f"recovered: cannot compare: {why}", after)
    sha = {r: (reference[r].end, resumed[r].end) for r in reference}
    differ = [r for r, (a, b) in sorted(sha.items()) if a.params_sha256 != b.params_sha256]
    if differ:
        return Recovered(
            False,
            f"recovered but final parameters DIFFER from an uninterrupted run on ranks "
            f"{','.join(map(str, differ))}",
            after,
        )
    digest = sha[min(sha)][0].params_sha256[:12]
    return Recovered(
        True,
        f"recovered: final parameters of all {len(reference)} ranks bitwise identical to an "
        f"uninterrupted run (sha256 {digest}..., resumed after step {after})",
        after,
    )


def compare_survivors(resumed: Mapping[int, RankLog], world: int) -> Recovered:
    """A host lost under torchrun: the new, smaller world started fresh, so it is judged on
    its own, not bitwise against the uninterrupted world (its gradients are averaged over
    other shards, in another order): every rank ended with parity and identical replicas."""
    ends = {r: resumed[r].end if r in resumed else None for r in range(world)}
    missing = [r for r, end in ends.items() if end is None]
    broken = [r for r, end in ends.items() if end is not None and not end.parity]
    if missing or broken:
        why = f"no end record for ranks {missing}" if missing else f"parity broken on {broken}"
        return Recovered(False, f"survived: NO, the new world of {world}: {why}", 0, False)
    shas = {end.params_sha256 for end in ends.values() if end is not None}
    if len(shas) != 1:
        return Recovered(False, f"survived: NO, the {world} replicas differ at the end", 0, False)
    return Recovered(
        True,
        f"survived: the {world} ranks left trained a new world from step 0 to the end, parity "
        f"holds and the replicas are identical (sha256 {shas.pop()[:12]}...)",
        0,
        False,
    )


# What torchrun made of the fault, judged: plain data in, checks and lines out. :func:`judge`
# decides from what the run handed over alone whether torchrun recovered: the reference ran
# clean, the kill landed, every rank was set up again after it, the new workers resumed from a
# checkpoint that existed before the fault, the restarted run ended with every torchrun
# exiting 0 and parity holding, and every rank's final parameters equal the reference's bit
# for bit (:func:`compare_final`). Pure: tested from synthetic values as well as from a real
# run; ``report.json`` holds all of it.


@dataclass(frozen=True)
class Check:
    ok: bool
    text: str


@dataclass
class Verdict:
    timeline: list[str]
    checks: list[Check]
    recovered: Recovered
    restarted: dict[int, int]  # rank -> the step it resumed after, from its first set-up after
    shas: dict[int, tuple[str | None, str | None]]  # rank -> (reference, restarted)
    fault_at_s: float | None  # the kill, seconds into the faulted job

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks) and self.recovered.ok

    def lines(self) -> list[str]:
        at = "" if self.fault_at_s is None else f"; the fault came {self.fault_at_s:.2f} s in"
        out = [f"restart timeline (seconds from the fault{at}):", *self.timeline, "checks:"]
        out += [f"  {'ok  ' if c.ok else 'FAIL'}  {c.text}" for c in self.checks]
        pairs = [
            f"rank {r} {(b or '-')[:12]}.. {'=' if a and a == b else '!='} {(a or '-')[:12]}.."
            for r, (a, b) in sorted(self.shas.items())
        ]
        out.append(
            "sha256 of the final parameters, restarted vs uninterrupted: " + "; ".join(pairs)
        )
        out.append(self.recovered.line)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "fault_at_s": self.fault_at_s,
            "timeline": self.timeline,
            "checks": [asdict(c) for c in self.checks],
            "restarted": {str(r): s for r, s in sorted(self.restarted.items())},
            "resumed_after": self.recovered.resumed_after,
            "bitwise_equal": self.recovered.ok and self.recovered.bitwise,
            "recovered": self.recovered.line,
            "final_params_sha256": {
                str(r): {"reference": a, "restarted": b, "equal": a is not None and a == b}
                for r, (a, b) in sorted(self.shas.items())
            },
        }


def _ended(job: JobOutcome, what: str) -> str:
    codes = ", ".join(f"node{n} {c}" for n, c in sorted(job.codes.items())) or "none"
    took = "" if job.seconds is None else f" after {job.seconds:.1f} s"
    still = f", still running at the deadline: nodes {job.running}" if job.running else ""
    return f"{what}: torchrun's exit codes {codes}{took}{still}"


def judge(result: TorchrunKillResult) -> Verdict:
    """Every check from what the run handed over, the timeline, and the bitwise verdict."""
    plan, kill, world = result.plan, result.kill, result.plan.layout.world_size
    ref_logs, run_logs = result.logs.get("reference", {}), result.logs.get("fault", {})
    ref_parity = [r for r in range(world) if r in ref_logs and ref_logs[r].end is not None]
    checks = [
        Check(
            result.reference.clean
            and len(ref_parity) == world
            and all(ref_logs[r].end.parity for r in ref_parity),
            _ended(result.reference, "reference (uninterrupted)")
            + f"; {len(ref_parity)} of {world} ranks ended",
        ),
        _kill_check(kill),
    ]
    fault_t = result.fault.started if kill is None else kill.start
    restarted, verdict = _after_fault(result.events, fault_t)
    after = plan.survivors  # the new world's ranks: all, or those of the hosts left
    missing = sorted(set(range(after)) - set(restarted))
    checks.append(
        Check(
            kill is not None and not missing,
            f"torchrun restarted the worker group: every rank of a world of {after} set up again "
            "after the fault"
            if not missing
            else f"ranks {missing} were not set up again after the fault (of {after})",
        )
    )
    checks.append(_resumed_check(plan, restarted, result.attempt_steps))
    holds = verdict is not None and verdict.holds
    said = verdict.message if verdict is not None else "no verdict after the fault"
    ended = _survived(result.fault, plan.lost) if plan.lost else result.fault.clean
    checks.append(Check(ended and holds, _ended(result.fault, "restarted run") + f"; {said}"))
    return Verdict(
        restart_timeline(result.events, fault_t, kill.what if kill else "none"),
        checks,
        compare_survivors(run_logs, after) if plan.lost else compare_final(ref_logs, run_logs),
        restarted,
        _shas(world, ref_logs, run_logs),
        None if kill is None else kill.start - result.fault.started,
    )


def _survived(job: JobOutcome, lost: tuple[int, ...]) -> bool:
    """The lost host's torchruns died with it; every other one exited 0."""
    codes = job.codes
    gone = all(codes.get(n, 0) != 0 for n in lost)
    return not job.running and gone and all(c == 0 for n, c in codes.items() if n not in lost)


def _kill_check(kill: WorkerKill | None) -> Check:
    if kill is None:
        return Check(False, "fault: no worker was killed")
    said = f" ({kill.output.strip()})" if kill.output.strip() else ""
    return Check(
        kill.code == 0,
        f"fault: {kill.what} when {kill.trigger}; kill exited {kill.code}{said}, "
        f"{kill.start - kill.trigger_time:.2f} s after the record arrived",
    )


def _after_fault(
    events: list[Event], fault_t: float
) -> tuple[dict[int, int], VerdictRecord | None]:
    """Per rank the step its first set-up after the fault resumed after; rank 0's verdict."""
    restarted: dict[int, int] = {}
    verdict: VerdictRecord | None = None
    for e in events:
        if isinstance(e, RecordEvent) and e.t >= fault_t:
            if isinstance(e.record, ConfigRecord):
                restarted.setdefault(e.record.rank, e.record.start_step)
            elif isinstance(e.record, VerdictRecord) and e.record.rank == 0:
                verdict = e.record
    return restarted, verdict


def _shas(
    world: int, ref_logs: Mapping[int, RankLog], run_logs: Mapping[int, RankLog]
) -> dict[int, tuple[str | None, str | None]]:
    """Per rank the final parameters' sha256, (reference, restarted); None: no end record."""
    ranks = sorted(set(range(world)) | set(ref_logs) | set(run_logs))
    return {
        r: tuple(
            logs[r].end.params_sha256 if r in logs and logs[r].end else None
            for logs in (ref_logs, run_logs)
        )
        for r in ranks
    }  # type: ignore[misc]


def _resumed_check(
    plan: TorchrunKillPlan, restarted: dict[int, int], attempt_steps: dict[int, list[int]]
) -> Check:
    """The new workers agree on one start, a checkpoint that existed before the fault: at most
    the last step every rank had logged in its first attempt (that step's checkpoint may
    still have been in writing, so an older one is no failure)."""
    starts = sorted(set(restarted.values()))
    if plan.lost:
        ok = starts == [0]
        return Check(
            ok,
            "the new world started fresh (step 0), as asked (--checkpoint-every 0)"
            if ok
            else f"the new world did not start at step 0 together: steps {starts}",
        )
    firsts = [steps[0] for steps in attempt_steps.values() if steps]
    done = min(firsts) if firsts else 0
    every = plan.train.checkpoint_every
    newest = done - done % every
    if len(starts) != 1:
        return Check(False, f"the restarted workers did not agree on a start: steps {starts}")
    after = starts[0]
    ok = 0 < after <= done and (after % every == 0 or after == plan.train.steps)
    how = f"resumed after step {after}" if after else "started fresh (step 0)"
    return Check(
        ok,
        f"the restarted workers {how}: checkpoints every {every} steps, every rank had logged "
        f"step {done} before the fault (newest checkpoint then: step {newest})",
    )


@dataclass
class TorchrunSummary:
    """The verdict, and the run it was judged from: ``report.json``, the console text and the
    page are each built from it."""

    result: TorchrunKillResult
    verdict: Verdict


def analyse(result: TorchrunKillResult) -> TorchrunSummary:
    return TorchrunSummary(result, judge(result))


# ``report.json``: the plan, the kill, both jobs' exits, the attempts' last steps and the
# verdict.


def write_files(summary: TorchrunSummary) -> list[Path]:
    result, verdict = summary.result, summary.verdict
    plan = result.plan
    data = {
        "run_id": result.run_id,
        "ok": verdict.ok,
        "seconds": round(result.seconds, 3),
        "plan": {
            "launcher": "torchrun",
            "mode": plan.mode,
            "rank": plan.rank,
            "at_step": plan.at_step,
            "nodes": plan.nodes,
            "procs_per_node": plan.procs_per_node,
            "max_restarts": plan.max_restarts,
            "run_timeout_s": plan.run_timeout_s,
            "image": plan.image,
            "train": plan.config("fault").to_dict(),
        },
        "kill": asdict(result.kill) if result.kill else None,
        "phases": {
            job.name: {
                "started": job.started,
                "seconds": job.seconds,
                "exit_codes": {str(n): c for n, c in sorted(job.codes.items())},
                "running": job.running,
            }
            for job in (result.reference, result.fault)
        },
        "attempt_steps": {str(r): s for r, s in sorted(result.attempt_steps.items())},
        **verdict.to_dict(),
    }
    path = result.run_dir / "report.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    return [path]


# The page: the restart timeline, the checks, the final parameters of both runs side by side,
# and every job's ranks. From the run's summary.

_FILES = [("report.json", "the plan, the kill, both jobs' exits, the checks")]


def page(summary: TorchrunSummary) -> Results:
    verdict = summary.verdict
    at = "" if verdict.fault_at_s is None else f"; the fault came {verdict.fault_at_s:.2f} s in"
    checks = Table(("check", "what"), [["ok" if c.ok else "FAIL", c.text] for c in verdict.checks])
    shas = Table(
        ("rank", "uninterrupted sha256", "restarted sha256", "equal"),
        [
            [r, a or "-", b or "-", a is not None and a == b]
            for r, (a, b) in sorted(verdict.shas.items())
        ],
    )
    sections = [
        Section(
            f"Restart timeline (seconds from the fault{at})", [Text(verdict.timeline, pre=True)]
        ),
        Section("Checks", [checks]),
        Section("Final parameters", [shas]),
    ]
    restarted = ", ".join(f"rank {r} after step {s}" for r, s in sorted(verdict.restarted.items()))
    figure = f"restarted: {restarted}" if restarted else "no worker restarted"
    result = summary.result
    phases = {job.name: job.codes for job in (result.reference, result.fault)}
    run = (result.run_id, result.run_dir, result.seconds)
    return kill_page(run, sections, phases, (verdict.recovered.line, figure, verdict.ok), _FILES)


def report(result: TorchrunKillResult) -> int:
    """Exit 0 when the workers were restarted, resumed from a checkpoint and ended bitwise
    identical to the uninterrupted run."""
    summary = analyse(result)
    write_files(summary)
    made = page(summary)
    for line in publish(result.run_dir, made.page, made.summary, made.files, made.jobs):
        print(line)
    print("\n".join(summary.verdict.lines()))
    return 0 if summary.verdict.ok else 1
