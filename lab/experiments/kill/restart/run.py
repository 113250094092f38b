"""``lab kill``'s run: one cluster for every phase, one training job per phase, the fault
injected when the target rank's records say it is time.

The cluster's context manager collects every job into ``runs/<run-id>/<phase>/`` and removes
everything labelled with the run id, also on errors and Ctrl-C; the fault's own context
manager exits first, so whatever it left (a paused container, iptables rules) is released
before the logs are collected and the containers removed. Between phases every node gets a
fresh main process (:meth:`Cluster.restart`): no rank of one phase survives into the next.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ddp.torchfree import FailureRecord, StepRecord, load_dumps, load_run
from lab.engine.client import NodeFailed, RunTimeout, connect
from lab.engine.cluster import Cluster
from lab.engine.events import Event, ExitEvent, LineEvent, RecordEvent
from lab.engine.job import Job
from lab.engine.specs import job_dir
from lab.experiments.kill.restart.plan import KillPlan
from lab.experiments.kill.restart.result import Injection, KillResult, PhaseOutcome
from lab.experiments.kill.words import tidy_line
from lab.faults import Fault
from lab.progress import Progress

__all__ = ["run"]

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
