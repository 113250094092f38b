"""``lab kill --launcher torchrun``'s run: an uninterrupted torchrun job, then one whose worker
of rank R is SIGKILLed, on the same containers; torchrun's agents do the rest.

The kill is triggered by rank R's typed step record and aimed at the pid its set-up record
gave (``ConfigRecord.pid``, in its container's pid namespace), on the node that record came
from: torchrun's rendezvous, not lab, decides where a rank runs. After the kill nothing is
raised: whatever torchrun made of it is handed to the judge. The cluster's context manager
collects both jobs into ``runs/<run-id>/<job>/`` and removes everything labelled with the
run id, also on errors and Ctrl-C.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ddp.torchfree import ConfigRecord, load_attempts, load_run
from lab.engine.client import LabError, NodeFailed, RunTimeout, connect
from lab.engine.cluster import Cluster
from lab.engine.events import Event, ExitEvent, LineEvent, RecordEvent
from lab.engine.job import Job
from lab.engine.specs import job_dir
from lab.experiments.kill.torchrun.plan import TorchrunKillPlan
from lab.experiments.kill.torchrun.result import JobOutcome, TorchrunKillResult, WorkerKill
from lab.faults.host import HostDown
from lab.progress import Progress, follow_steps

__all__ = ["run"]

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
