"""The figures of a ``lab kill --recovery live`` run, from the ranks' typed records: one row per
recovery path (the time from the fault to the next committed step, the healing, the steps
redone, the step time without faults) and the verdict. Pure: tested from synthetic records.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ddp.torchfree import (
    CommitRecord,
    ConfigRecord,
    HealRecord,
    Record,
    RecoveryVerdictRecord,
    recovery_figures,
    torchft_agreement,
)
from lab.experiments.kill.live.result import LiveResult
from lab.experiments.kill.result import KillResult

__all__ = ["PathRow", "Verdict", "judge", "live_records", "live_row", "restart_row"]


@dataclass(frozen=True)
class PathRow:
    """One way back from the fault. None: did not happen, or does not apply."""

    name: str
    fault_to_commit_s: float | None
    heal_s: float | None
    steps_redone: int | None
    step_ms: float | None  # median step time before the fault


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
    :func:`ddp.recovery.drivers.timeline.figures` it came from."""
    name = "torchft" if result.plan.recovery == "torchft" else "ours (live)"
    fault = result.moment("fault")
    if fault is None:
        return PathRow(name, None, None, None, None), {}
    records = live_records(result)
    # The heal figures are the replacement's: a survivor left out of a quorum (it noticed the
    # fault after the check-in window) heals too, and may come first.
    lost = result.plan.rank
    mine = [r for r in records if not isinstance(r, HealRecord) or r.rank == lost]
    figs = recovery_figures(mine, fault.t, result.plan.nodes)
    failed = {r.step for r in records if isinstance(r, CommitRecord) and not r.committed}
    row = PathRow(
        name, figs.get("first_commit_s"), figs.get("heal_s"), len(failed), figs.get("step_ms")
    )
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
    # every rank's steps, as ddp.recovery.drivers.timeline.figures takes the live path's
    ref = [s.step_ms for log in kill.logs.get("reference", {}).values() for s in log.steps]
    step_ms = statistics.median(ref) if ref else None
    return PathRow("restart (kill --recover)", to_commit, None, redone, step_ms)


def judge(result: LiveResult) -> Verdict:
    """Exit 0 only if the survivors committed a step without the lost rank, every member of
    the last quorum says the replicas were identical after every committed step and every
    step was committed, and (``--rejoin``) the replacement healed."""
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
        lines.append("the replacement did not heal from a peer")
    if ok and verdicts:
        lines.append(verdicts[0].message + (f"; {said}" if said else ""))
    return Verdict(ok, lines)
