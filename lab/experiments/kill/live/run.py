"""``lab kill --recovery live``'s run: the job's etcd in three containers, the launcher's
decider in one, one rank per container, the fault injected when the target's records say so,
a replacement started once the survivors committed a step without it (``--rejoin``); then, on
fresh containers, the restart path.

The jobs are followed only through their typed records (the fault's trigger, the survivors'
first commit at the smaller world, the end): :mod:`ddp.recovery.records`.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Iterator

from ddp.torchfree import JOB_ENV, SECRET_ENV, CommitRecord, TrainConfig, load_attempts
from lab.engine.client import RunTimeout, connect
from lab.engine.cluster import Cluster
from lab.engine.etcd import lab_etcd
from lab.engine.events import Event, ExitEvent, LineEvent, RecordEvent
from lab.engine.job import Job
from lab.engine.training import train_argvs
from lab.experiments.kill.live.plan import COORDINATOR_PORT, LivePlan
from lab.experiments.kill.live.result import LiveResult, Moment
from lab.experiments.kill.restart.run import run as run_restart
from lab.experiments.kill.words import tidy_line
from lab.faults import FAULTS, Fault
from lab.progress import Progress

__all__ = ["run"]

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
            token = secrets.token_hex(16)
            env = {**etcd.env, SECRET_ENV: token, JOB_ENV: f"job-{token[:8]}"}
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
    at, when = start, f"the call took {took:.3f} s"
    if faults[0].landed_at is not None:
        at = faults[0].landed_at
        when = f"Docker's kill event {at - start:.3f} s into the call; the call took {took:.3f} s"
        if len(faults) > 1:
            when = f"{when} for all {len(faults)}"
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
