"""The closing block of ``lab kill`` and its ``report.json``: the fault report, the recovery
check, and the exit code they make."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lab.experiments.kill.analysis import FaultReport, build_report
from lab.experiments.kill.recovery import Recovery, compare_runs
from lab.experiments.kill.result import KillResult

__all__ = ["Summary", "summarize", "summary_dict", "write_summary"]


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


def summary_dict(result: KillResult, summary: Summary) -> dict[str, Any]:
    plan = result.plan
    return {
        "run_id": result.run_id,
        "ok": summary.ok,
        "seconds": round(result.seconds, 3),
        "plan": {
            "rank": plan.rank,
            "at_step": plan.at_step,
            "mode": plan.mode,
            "nodes": plan.nodes,
            "recover": plan.recover,
            "run_timeout_s": plan.run_timeout_s,
            "image": plan.image,
            "train": plan.train.to_dict(),
        },
        "injection": asdict(result.injection) if result.injection else None,
        "phases": {
            name: {"started": ph.started, "exit_codes": {str(r): c for r, c in ph.codes.items()}}
            for name, ph in result.phases.items()
        },
        "fault": summary.report.to_dict(),
        "recovery": asdict(summary.recovery) if summary.recovery else None,
    }


def write_summary(result: KillResult, summary: Summary) -> Path:
    path = result.run_dir / "report.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary_dict(result, summary), indent=2, default=str))
    return path
