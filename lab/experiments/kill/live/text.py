"""What ``lab kill --recovery live`` prints, from the run's summary: the timeline from the
ranks' records and the lab's own moments, the table of recovery paths (its legend says how
each column is measured), the verdict, and last, one line a script can read. Pure."""

from __future__ import annotations

from collections.abc import Sequence

from ddp.torchfree import recovery_timeline
from lab.experiments.kill.live.analysis import LiveSummary, PathRow, live_records

__all__ = ["LEGEND", "headline", "lines", "table"]

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
