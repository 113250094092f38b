"""The host side of a link that changes during a job: an ``on_event`` for
:func:`lab.experiments.followed.train_to_end` that re-shapes the link when rank 0 reports the
step (:class:`ChangeTrigger`), and the idle re-check after the job (:func:`recheck`).

The change runs inside the follower, so it happens exactly once, when the one reader of the
ranks' records sees the step; the ranks train on meanwhile (their lines wait in the job's
queue). What happened goes into a :class:`lab.experiments.link_change.LinkChange`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ddp.torchfree import StepRecord
from lab.experiments.link_change import ChangePlan, LinkChange
from lab.shaping.changing import ChangingLink
from lab.shaping.link import ShapingReport

__all__ = ["ChangeTrigger", "recheck"]


class ChangeTrigger:
    """Called with every event of a job; at rank 0's step ``plan.at_step`` (or the first one
    past it) shapes ``link`` as ``plan`` asks, probed while the job trains, and fills
    ``change``."""

    def __init__(self, link: ChangingLink, plan: ChangePlan, echo: Callable[[str], None]) -> None:
        self.link, self.plan, self.echo = link, plan, echo
        self.change = LinkChange(plan.at_step, plan.to_ms, plan.to_rate_mbit)
        self.fired = False
        link.measure_baseline()  # before the job: on the idle link

    def __call__(self, event: object) -> None:
        record = getattr(event, "record", None)
        if self.fired or not isinstance(record, StepRecord) or record.rank != 0:
            return
        if record.step < self.plan.at_step:
            return
        self.fired = True
        change = self.change
        change.seen_t = time.time()
        report = self.link.set(self.plan.to_ms, self.plan.to_rate_mbit, strict=False)
        if report is None:  # the bare link: nothing to probe
            change.applied_t = time.time()
            change.line = "link cleared: unshaped"
        else:
            change.applied_t = report.applied_t
            change.line = report.line()
            change.probed = {k: dict(getattr(report, k)) for k in ("baseline", "measured")}
            change.mismatch = report.mismatch
        took = change.applied_t - change.seen_t
        off = f"; NOT as asked: {change.mismatch}" if change.mismatch else ""
        self.echo(
            f"  link changed to {self.plan.text} ({took:.1f} s to re-shape; probed during "
            f"the job): {change.line.splitlines()[0]}{off}"
        )


def recheck(link: ChangingLink, plan: ChangePlan) -> ShapingReport | None:
    """After the job, on the idle link: the changed link shaped again and verified in full
    (delay, and rate with a bulk transfer), a mismatch stopping the run; None for the bare
    link."""
    return link.set(plan.to_ms, plan.to_rate_mbit)
