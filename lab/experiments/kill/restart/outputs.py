"""``lab kill``'s ``report.json``: the plan, the injection, every phase's exits, the fault
report and the recovery check."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from lab.experiments.kill.restart.analysis import RestartSummary

__all__ = ["summary_dict", "write_files"]


def summary_dict(summary: RestartSummary) -> dict[str, Any]:
    result = summary.result
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


def write_files(summary: RestartSummary) -> list[Path]:
    path = summary.result.run_dir / "report.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary_dict(summary), indent=2, default=str))
    return [path]
