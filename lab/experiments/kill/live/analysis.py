"""The figures of a ``lab kill --recovery live`` run, from the ranks' typed records: one row per
recovery path (the time from the fault to the next committed step, the healing, the steps
redone, the step period without faults) and the verdict; :func:`analyse` puts them into the
one :class:`LiveSummary` that ``live.json``, the console text and the page are built from.
Pure: tested from synthetic records.

The step period is measured the same way in every row: per step, when the last rank finished
it (its commit record on the live paths; the end of its step record on the restart path, whose
steps commit when they end), then the median time between consecutive steps' ends, over the
steps before the fault (the restart path: the same steps of its uninterrupted run). It is what
a step costs a user, vote, checkpoint writes and all.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ddp.torchfree import (
    CommitRecord,
    ConfigRecord,
    HealRecord,
    QuorumRecord,
    Record,
    RecoveryVerdictRecord,
    StepRecord,
    recovery_figures,
    torchft_agreement,
)
from lab.experiments.kill.live.plan import COORDINATOR_LOST, ETCD_MEMBERS
from lab.experiments.kill.live.result import LiveResult
from lab.experiments.kill.restart.result import KillResult

__all__ = [
    "LiveSummary",
    "PathRow",
    "Verdict",
    "analyse",
    "judge",
    "live_records",
    "live_row",
    "restart_row",
    "step_period_ms",
]


@dataclass(frozen=True)
class PathRow:
    """One way back from the fault. None: did not happen, or does not apply."""

    name: str
    fault_to_commit_s: float | None
    heal_s: float | None
    steps_redone: int | None
    step_ms: float | None  # the step period without faults (see the module's docstring)


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
