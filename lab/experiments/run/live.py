"""``python -m lab run --recovery live -- python train.py``: the user's own loop with live
recovery (``ddp.recovery.api.Manager``) across the lab's nodes, a replica killed on cue, a
replacement healed from a peer, every quorum, fault and heal on the report's timeline.

The pieces are ``lab kill --recovery live``'s: the job's etcd in three containers with mutual
TLS (:func:`lab.engine.etcd.lab_etcd`), the launcher's decider in one more, the job's secret
and id in the environment (:func:`lab.engine.etcd.job_env`), ``docker kill`` of the replica's
container (:class:`lab.faults.kill.Kill`) and a replacement started in it after
:meth:`Cluster.restart`. The script is not changed: with no ``record=``, its ``Manager`` writes
its typed records (``ddp.recovery.records``) to ``DDP_LOG_DIR`` and as ``@ddp`` lines, which
the lab sets; the cue and the verdict come from those records alone.

One module, read top to bottom in the order data flows: the result the run hands over, the
run on the engine, the analysis (pure: one :class:`LiveRunSummary` from the result), then the
console's lines, ``report.json`` and the page, each from that summary, and :func:`report`.
The plan is ``lab run``'s :class:`~lab.experiments.run.run.RunPlan` with ``recovery="live"``
(its refusals: ``RunPlan._check_live``).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ddp.torchfree import (
    ENV_EMIT_RECORDS,
    ENV_LOG_DIR,
    CommitRecord,
    Headline,
    HealRecord,
    LogError,
    Page,
    QuorumRecord,
    Record,
    Section,
    Table,
    Text,
    load_attempts,
    recovery_figures,
    recovery_timeline,
)
from lab.engine.client import connect
from lab.engine.cluster import Cluster
from lab.engine.etcd import ETCD_MEMBERS, decider_argv, job_env, lab_etcd
from lab.engine.events import Event, ExitEvent, LineEvent, RecordEvent
from lab.engine.job import Job
from lab.engine.layout import Layout
from lab.engine.specs import job_dir
from lab.experiments.kill.shared import tidy_line
from lab.experiments.run.faults import FaultCue
from lab.experiments.run.run import JOB, NODE_WORKDIR, RunPlan, copy_workdir, image_for
from lab.faults.kill import Kill
from lab.measure.moments import Moment, first_moment
from lab.report.common import command_line
from lab.report.publish import publish
from lab.report.results import Results
from lab.report.summary import RunSummary, started_at

__all__ = [
    "FILE",
    "HEARTBEAT_S",
    "REJOIN",
    "LiveRunResult",
    "LiveRunSummary",
    "Moment",
    "analyse",
    "cue_due",
    "lines",
    "page",
    "replica_argvs",
    "report",
    "run",
    "write_files",
]

HEARTBEAT_S = 2.0  # the decider's lease TTL: the Manager's default heartbeat timeout
REJOIN = "rejoin"  # the replacement's job; its records go to the first job's log directory
FILE = "report.json"


# What the run hands to its report: plain data, so the analysis is built and tested from
# synthetic records as well as from a real run.


@dataclass
class LiveRunResult:
    plan: RunPlan
    run_id: str
    run_dir: Path
    image: str = ""
    started: float = 0.0  # the job's start, wall clock
    seconds: float = 0.0
    moments: list[Moment] = field(default_factory=list)
    # replica -> its attempts' records, oldest first (the replacement's after the first's)
    records: dict[int, list[list[Record]]] = field(default_factory=dict)
    codes: dict[str, dict[int, int]] = field(default_factory=dict)  # job -> replica -> exit
    running: list[int] = field(default_factory=list)  # replicas stopped by the run timeout
    problem: str | None = None  # what the run itself could not do (a cue that never came)

    def moment(self, kind: str) -> Moment | None:
        return first_moment(self.moments, kind)


# The run: etcd on nodes N+1..N+3, the decider on node N, replica R on node R (``RANK=R``), in
# the workdir; the kill when replica R's commit record of step N - 1 arrives (or at=SECONDS);
# with ``rejoin``, once the survivors committed a step at world N - 1, replica R's container
# restarted and the same command started in it again with the same ``RANK``. Every job is
# followed through its records; the cluster's context manager collects and removes everything.

_Echo = Callable[[str], None]
_POLL_S = 0.05  # per job, when following several
_END_GRACE_S = 60.0  # after the replicas, how long the decider gets to exit


def replica_argvs(plan: RunPlan, ranks: list[int] | None = None) -> dict[int, list[str]]:
    """Replica -> its argv: ``RANK=R``, ``cd`` into the workdir, the command as given."""
    return {
        rank: ["env", f"RANK={rank}", "sh", "-c", 'cd "$0" && exec "$@"', NODE_WORKDIR, *plan.argv]
        for rank in (range(plan.nodes) if ranks is None else ranks)
    }


def cue_due(cue: FaultCue, event: Event | None, now: float, started: float | None) -> bool:
    """Has the kill's moment come? Pure: ``at-step=N`` when replica R's record says it
    committed step N - 1 (so the kill lands in step N); ``at=S`` by the wall clock."""
    if cue.at_s is not None:
        return started is not None and now - started >= cue.at_s
    r = event.record if isinstance(event, RecordEvent) else None
    assert cue.at_step is not None
    return (
        isinstance(r, CommitRecord)
        and r.committed
        and r.rank == cue.rank
        and r.step >= cue.at_step - 1
    )


class _Follow:
    """Every job's lines under the replica's name; progress from the commit records."""

    def __init__(self, plan: RunPlan, echo: _Echo) -> None:
        self.plan, self.echo = plan, echo
        self.shown = 0.0
        self.last: CommitRecord | None = None

    def __call__(self, job: str) -> Callable[[Event], None]:
        def follow(event: Event) -> None:
            if isinstance(event, LineEvent):
                who = f"node{event.node}" if event.rank is None else f"rank{event.rank}"
                self.echo(f"[{job} {who}] {tidy_line(event.text)}")
            elif isinstance(event, RecordEvent) and isinstance(event.record, CommitRecord):
                r = event.record
                if r.committed and (self.last is None or r.step > self.last.step):
                    self.last = r
                    now = time.monotonic()
                    if self.plan.progress and now - self.shown >= 5.0:
                        self.shown = now
                        self.echo(f"progress: step {r.step} committed at world {r.world_size}")
            elif isinstance(event, ExitEvent):
                self.echo(f"[{job} rank{event.rank}] exited {event.code}")

        return follow


def _poll(jobs: list[Job]) -> list[Event]:
    return [e for e in (j.poll(_POLL_S) for j in jobs) if e is not None]


def _done(jobs: list[Job], waited: dict[str, list[int]]) -> bool:
    return all(all(r in j.exits for r in waited.get(j.name, j.ranks)) for j in jobs)


def _inject(fault: Kill, cue: FaultCue, reached: CommitRecord | None) -> Moment:
    start = time.time()
    fault.inject()
    at = fault.landed_at if fault.landed_at is not None else start
    had = f"; it had committed step {reached.step}" if reached is not None else ""
    text = f"lab: kill rank {cue.rank} {cue.cue()} ({fault.detail}{had})"
    return Moment(at, text, "fault")


def _follow(
    cluster: Cluster, plan: RunPlan, env: dict[str, str], follow: _Follow, result: LiveRunResult
) -> None:
    """The replicas start to end; the kill and the replacement on their cues."""
    decider = cluster.job(
        "decider",
        {plan.nodes: decider_argv(plan.nodes, HEARTBEAT_S, plan.lifetime_s)},
        plan.lifetime_s,
        per_node=True,
        env=env,
        echo=follow("decider"),
    )
    cue = plan.faults[0] if plan.faults else None
    with contextlib.ExitStack() as stack:
        fault = stack.enter_context(Kill()) if cue is not None else None
        if fault is not None:
            assert cue is not None and cue.rank is not None
            fault.prepare(cluster, cue.rank)  # one replica per node: the replica's node
        job = cluster.job(JOB, replica_argvs(plan), plan.run_timeout_s, env=env, echo=follow(JOB))
        result.started = job.started
        jobs = [decider, job]
        deadline = time.monotonic() + plan.run_timeout_s
        replicas = {JOB: list(range(plan.nodes)), "decider": []}
        fired = waiting_rejoin = False
        reached: dict[int, CommitRecord] = {}
        while time.monotonic() < deadline and not _done(jobs, replicas):
            events = _poll(jobs) or [None]
            for event in events:
                r = event.record if isinstance(event, RecordEvent) else None
                if isinstance(r, CommitRecord) and r.committed:
                    reached[r.rank] = r
                if cue is not None and not fired and cue_due(cue, event, time.time(), job.started):
                    assert fault is not None and cue.rank is not None
                    fired = True
                    moment = _inject(fault, cue, reached.get(cue.rank))
                    result.moments.append(moment)
                    follow.echo(f"[lab] {moment.text}")
                    replicas[JOB] = [n for n in range(plan.nodes) if n != cue.rank]
                    waiting_rejoin = cue.rejoin
                elif (
                    waiting_rejoin
                    and isinstance(r, CommitRecord)
                    and r.committed
                    and r.world_size == plan.nodes - 1
                ):
                    assert fault is not None and cue is not None and cue.rank is not None
                    waiting_rejoin = False
                    fault.release()
                    cluster.restart(cue.rank)  # the old process goes for good
                    jobs.append(
                        cluster.job(
                            REJOIN,
                            replica_argvs(plan, [cue.rank]),
                            plan.run_timeout_s,
                            env=env,
                            echo=follow(REJOIN),
                        )
                    )
                    text = f"lab: replacement for rank {cue.rank} started (RANK={cue.rank})"
                    result.moments.append(Moment(time.time(), text, "replacement"))
                    follow.echo(f"[lab] {text}")
        if cue is not None and not fired:
            before = (
                f"rank {cue.rank} did not commit step {cue.at_step - 1}"
                if cue.at_step is not None
                else f"{cue.at_s:g} s did not pass"
            )
            result.problem = (
                f"the fault {cue.describe()} never fired: {before} before the job ended (give "
                "the script more steps)"
            )
        elif waiting_rejoin:
            result.problem = (
                f"no step was committed at world {plan.nodes - 1} after the kill, so no "
                "replacement was started"
            )
        result.running = sorted(r for j in jobs[1:] for r in j.running)
        grace = time.monotonic() + _END_GRACE_S
        while time.monotonic() < grace and not _done(jobs, {}):
            _poll(jobs)
        result.codes = {j.name: dict(j.codes) for j in jobs}
        for j in jobs:
            j.close()


def run(plan: RunPlan, echo: _Echo = print) -> LiveRunResult:
    """The live job on one cluster (replicas, the decider, etcd); collect; always clean up."""
    client = connect()
    started = time.monotonic()
    image = image_for(client, plan, echo)
    decider = plan.nodes
    etcd_nodes = tuple(range(decider + 1, decider + 1 + ETCD_MEMBERS))
    cluster = Cluster(
        client,
        Layout(plan.nodes + 1 + ETCD_MEMBERS, 1),
        image=image,
        lifetime_s=plan.lifetime_s,
        echo=echo,
    )
    cluster.run_dir = run_dir = plan.runs_dir / cluster.run_id
    result = LiveRunResult(plan, cluster.run_id, run_dir, image=image)
    echo(f"run {cluster.run_id}: {plan.describe()}; image {image}; output in {run_dir}/")
    try:
        with cluster, contextlib.ExitStack() as stack:
            copy_workdir(cluster, plan, echo)
            etcd = stack.enter_context(lab_etcd(cluster, etcd_nodes, plan.lifetime_s))
            # The Manager (no record= given) writes its records here and as @ddp lines; the
            # replacement's go beside the first attempt's, as rank<R>.attempt1.jsonl.
            env = {**job_env(etcd), ENV_LOG_DIR: f"{job_dir(JOB)}/logs", ENV_EMIT_RECORDS: "1"}
            where = ", ".join(f"node{n}" for n in etcd.nodes)
            echo(f"live recovery: etcd on {where}, the decider on node{decider}")
            _follow(cluster, plan, env, _Follow(plan, echo), result)
    finally:
        result.seconds = time.monotonic() - started
    logs = run_dir / JOB / "logs"
    with contextlib.suppress(LogError, OSError):
        if logs.is_dir():
            attempts = load_attempts(logs)
            result.records = {r: [log.records for log in a] for r, a in sorted(attempts.items())}
    return result


# The analysis: what the records say, from the result alone. A user's loop writes no verdict
# of its own, so the lab judges from the commit records and the exits: the kill landed (when
# one was asked for), the survivors went on in a quorum without the lost replica, every
# survivor (and the replacement, from its heal on) committed every step 1..last exactly once,
# the same last step, where the commits carry the weights' digest the members of a step agree,
# and every replica that should have finished exited 0. Pure.


@dataclass
class LiveRunSummary:
    result: LiveRunResult
    figures: dict[str, float | int | None]
    committed: dict[int, list[int]]  # replica -> the steps its last attempt committed
    held: list[str]  # what was checked and held
    failed: list[str]  # what did not

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def last_step(self) -> int | None:
        return max((s[-1] for s in self.committed.values() if s), default=None)


def _all(result: LiveRunResult) -> list[Record]:
    return [r for attempts in result.records.values() for a in attempts for r in a]


def _once(steps: list[int], first: int, last: int) -> bool:
    return steps == list(range(first, last + 1))


def _held_steps(records: list[Record]) -> tuple[list[int], list[int]]:
    """What one attempt of a replica went through, in its records' order: (every step it
    committed or received by a heal, in order; the healed ones). A heal to step S after step k
    covers k + 1..S: the replica did not compute them, a peer's state brought it there (a
    replacement from nothing; a survivor left out of a quorum, from where it was)."""
    steps: list[int] = []
    healed: list[int] = []
    for r in records:
        if isinstance(r, CommitRecord) and r.committed:
            steps.append(r.step)
        elif isinstance(r, HealRecord):
            got = list(range((steps[-1] if steps else 0) + 1, r.step + 1))
            steps += got
            healed += got
    return steps, healed


def analyse(result: LiveRunResult) -> LiveRunSummary:
    plan = result.plan
    records = _all(result)
    fault = result.moment("fault")
    cue = plan.faults[0] if plan.faults else None
    lost = cue.rank if cue is not None and fault is not None else None
    figures = recovery_figures(
        [r for r in records if not isinstance(r, HealRecord) or r.rank == lost],
        fault.t if fault is not None else (result.started or 0.0),
        plan.nodes,
    )
    committed = {
        rank: [r.step for r in attempts[-1] if isinstance(r, CommitRecord) and r.committed]
        for rank, attempts in result.records.items()
        if attempts
    }
    held: list[str] = []
    failed: list[str] = []
    if result.problem is not None:
        failed.append(result.problem)
    survivors = [r for r in range(plan.nodes) if r != lost]
    codes = result.codes.get(JOB, {})
    last = max((committed.get(r, [0])[-1:] or [0])[0] for r in survivors)
    if last == 0:
        failed.append("no step was committed (no commit record: does the loop use Manager?)")
    held_steps = {r: _held_steps(result.records[r][-1]) for r in survivors if r in result.records}
    short = [r for r in survivors if not _once(held_steps.get(r, ([], []))[0], 1, last)]
    if last and short:
        failed.extend(
            f"rank {r} did not commit every step 1..{last} exactly once: "
            f"{_steps_text(held_steps.get(r, ([], []))[0])}"
            for r in short
        )
    elif last:
        said = f"ranks {', '.join(map(str, survivors))} committed every step 1..{last} once each"
        for r, (_, healed) in sorted(held_steps.items()):
            if healed:
                said += f" (rank {r} received steps {healed[0]}..{healed[-1]} by a heal)"
        held.append(said)
    bad = {r: codes.get(r) for r in survivors if codes.get(r) != 0}
    if bad:
        failed.append(
            "exits: " + ", ".join(f"rank {r} {'-' if c is None else c}" for r, c in bad.items())
        )
    if fault is not None and lost is not None:
        t = fault.t
        without = [
            q for q in records if isinstance(q, QuorumRecord) and q.t >= t and lost not in q.members
        ]
        went_on = figures.get("first_commit_n_minus_1_s")
        if not without or went_on is None:
            failed.append(f"no step was committed at world {plan.nodes - 1} after the kill")
        else:
            held.append(
                f"the survivors went on at world {plan.nodes - 1} {went_on:.2f} s after the kill "
                f"of rank {lost} (quorum {min(q.quorum_id for q in without)})"
            )
    if cue is not None and cue.rejoin and fault is not None and lost is not None:
        held_line, why = _replacement(result, lost, last, figures)
        (held if why is None else failed).append(held_line if why is None else why)
    split = _split(records)
    if split:
        failed.append(split)
    elif any(isinstance(r, CommitRecord) and r.params_sha256 for r in records):
        held.append("the members of every step started it from the same weights")
    return LiveRunSummary(result, figures, committed, held, failed)


def _replacement(
    result: LiveRunResult, lost: int, last: int, figures: dict
) -> tuple[str, str | None]:
    attempts = result.records.get(lost, [])
    if result.moment("replacement") is None:
        return "", f"no replacement for rank {lost} was started"
    if len(attempts) < 2:
        return "", f"the replacement for rank {lost} wrote no records"
    mine = attempts[-1]
    heal = next((r for r in mine if isinstance(r, HealRecord)), None)
    if heal is None:
        return "", f"the replacement for rank {lost} did not heal from a peer"
    steps = [r.step for r in mine if isinstance(r, CommitRecord) and r.committed]
    if not _once(steps, heal.step + 1, last):
        return "", (
            f"the replacement for rank {lost} healed at step {heal.step} but committed "
            f"{_steps_text(steps)}, not every step {heal.step + 1}..{last} once"
        )
    code = result.codes.get(REJOIN, {}).get(lost)
    if code != 0:
        return "", f"the replacement for rank {lost} exited {'-' if code is None else code}"
    return (
        f"rank {lost}'s replacement healed from rank {heal.from_rank} at step {heal.step} "
        f"({heal.nbytes / 1e6:.2f} MB in {heal.seconds * 1e3:.1f} ms) and committed steps "
        f"{heal.step + 1}..{last}",
        None,
    )


def _split(records: list[Record]) -> str | None:
    """Members that committed one step from different weights (when the commits carry the
    digest), else None."""
    seen: dict[int, set[str]] = {}
    for r in records:
        if isinstance(r, CommitRecord) and r.committed and r.params_sha256:
            seen.setdefault(r.step, set()).add(r.params_sha256)
    split = sorted(step for step, digests in seen.items() if len(digests) > 1)
    return f"steps {split} were committed from different weights" if split else None


def _steps_text(steps: list[int]) -> str:
    if not steps:
        return "no step"
    dup = sorted({s for s in steps if steps.count(s) > 1})
    gaps = sorted(set(range(steps[0], steps[-1] + 1)) - set(steps))
    said = f"steps {steps[0]}..{steps[-1]}"
    if dup:
        said += f", {dup} more than once"
    if gaps:
        said += f", {gaps} missing"
    if steps[0] != 1 and not gaps and not dup:
        said += f" (from {steps[0]})"
    return said


# What is printed, from the summary: the timeline (every quorum, notice, failed step and heal
# from the records, the lab's own moments merged), what held and what did not, and last the
# one line a script can read.


def headline(summary: LiveRunSummary) -> str:
    """``run: live recovery, 3 replicas on 3 nodes; <what held>`` or ``...; FAILED: ...``."""
    plan = summary.result.plan
    head = f"run: live recovery, {plan.nodes} replicas on {plan.nodes} nodes"
    if summary.ok:
        return f"{head}; " + "; ".join(summary.held)
    return f"{head}; FAILED: " + "; ".join(summary.failed)


def timeline(summary: LiveRunSummary) -> list[str]:
    result = summary.result
    fault = result.moment("fault")
    t0 = fault.t if fault is not None else result.started
    extra = [(m.t, m.text) for m in result.moments]
    return recovery_timeline(_all(result), t0, extra)


def lines(summary: LiveRunSummary) -> list[str]:
    """Everything printed after the run, the headline last."""
    fault = summary.result.moment("fault")
    after = "the fault" if fault is not None else "the job's start"
    out = [f"timeline (seconds after {after}; the replicas' records and the lab's moments):"]
    out += timeline(summary)
    out += [f"verdict: held: {line}" for line in summary.held]
    out += [f"verdict: FAILED: {line}" for line in summary.failed]
    out.append(headline(summary))
    return out


def write_files(summary: LiveRunSummary) -> list[Path]:
    result, plan = summary.result, summary.result.plan
    result.run_dir.mkdir(parents=True, exist_ok=True)
    doc = {
        "run_id": result.run_id,
        "ok": summary.ok,
        "seconds": round(result.seconds, 3),
        "headline": headline(summary),
        "recovery": "live",
        "plan": {
            "command": list(plan.command),
            "workdir": str(plan.workdir),
            "nodes": plan.nodes,
            "faults": [c.text for c in plan.faults],
            "image": result.image,
        },
        "moments": [asdict(m) for m in result.moments],
        "figures": summary.figures,
        "committed": {str(r): s for r, s in sorted(summary.committed.items())},
        "last_step": summary.last_step,
        "exit_codes": {
            job: {str(r): c for r, c in codes.items()} for job, codes in result.codes.items()
        },
        "held": summary.held,
        "failed": summary.failed,
        "timeline": timeline(summary),
    }
    path = result.run_dir / FILE
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return [path]


def page(summary: LiveRunSummary) -> Results:
    result = summary.result
    command = command_line("run")
    last = headline(summary)
    figure = (
        "-"
        if summary.figures.get("first_commit_s") is None or result.moment("fault") is None
        else f"{summary.figures['first_commit_s']:.2f} s to commit"
    )
    rows = []
    for rank, attempts in sorted(result.records.items()):
        for n, records in enumerate(attempts):
            steps = [r.step for r in records if isinstance(r, CommitRecord) and r.committed]
            job = JOB if n == 0 else REJOIN
            code = result.codes.get(job, {}).get(rank, "-")
            rows.append([rank, "replacement" if n else "first", _steps_text(steps), code])
    made = Page(
        f"lab run --recovery live: run {result.run_id}",
        Headline(command, last, figure, summary.ok),
        [
            Section("Timeline", [Text(lines(summary)[:-1], pre=True)]),
            Section(
                "How each replica ended",
                [Table(("rank", "attempt", "committed", "exit code"), rows)],
            ),
        ],
    )
    made_summary = RunSummary(
        "run", result.run_id, command, started_at(result.seconds), result.seconds, figure,
        last, summary.ok,
    )  # fmt: skip
    return Results(made, made_summary, [(FILE, "the moments, figures, commits and verdict")], [JOB])


def report(result: LiveRunResult) -> int:
    """Print the timeline and the verdict; write report.json and the page. Exit 0 only if
    every check held."""
    summary = analyse(result)
    written = write_files(summary)
    made = page(summary)
    text = lines(summary)
    print(f"took {result.seconds:.0f} s; wrote {result.run_dir}/: {written[0].name}")
    published = publish(result.run_dir, made.page, made.summary, made.files, made.jobs)
    print("\n".join([*text[:-1], *published, text[-1]]))
    return 0 if summary.ok else 1
