"""What ``lab kill`` prints after the restart path's run, from its summary: the fault report,
the recovery check, and last the diagnosis (and the recovery's verdict). Pure."""

from __future__ import annotations

from lab.experiments.kill.restart.analysis import RestartSummary

__all__ = ["lines"]


def lines(summary: RestartSummary) -> list[str]:
    """The report, then the closing lines: the diagnosis, and with --recover the recovery."""
    report, recovery = summary.report, summary.recovery
    out = report.lines()
    if recovery is not None:
        out.append(
            f"recovery: resumed from the checkpoint of step {recovery.resumed_from} (fault in "
            f"step {summary.result.plan.at_step}); sha256 of the final parameters, resumed vs "
            "uninterrupted: " + "; ".join(recovery.details)
        )
    out.append(report.last_line)
    if recovery is not None:
        out.append(recovery.last_line)
    return out
