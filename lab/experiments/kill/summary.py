"""The closing block of ``lab kill``: the fault report, the recovery check, and the exit code
they make (``report.json`` is :mod:`.outputs`)."""

from __future__ import annotations

from dataclasses import dataclass

from lab.experiments.kill.analysis import FaultReport, build_report
from lab.experiments.kill.recovery import Recovery, compare_runs
from lab.experiments.kill.result import KillResult

__all__ = ["Summary", "summarize"]


@dataclass
class Summary:
    report: FaultReport
    recovery: Recovery | None

    @property
    def ok(self) -> bool:
        """The diagnosis names the rank that was hit (and the recovery is bitwise identical)."""
        return self.report.ok and (self.recovery is None or self.recovery.ok)

    def lines(self, plan_at_step: int) -> list[str]:
        """The report, then the closing lines: the diagnosis, and with --recover the recovery."""
        out = self.report.lines()
        if self.recovery is not None:
            r = self.recovery
            out.append(
                f"recovery: resumed from the checkpoint of step {r.resumed_from} (fault in step "
                f"{plan_at_step}); sha256 of the final parameters, resumed vs uninterrupted: "
                + "; ".join(r.details)
            )
        out.append(self.report.last_line)
        if self.recovery is not None:
            out.append(self.recovery.last_line)
        return out


def summarize(result: KillResult) -> Summary:
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
    return Summary(report, recovery)
