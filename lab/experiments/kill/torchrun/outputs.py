"""``lab kill --launcher torchrun``'s ``report.json``: the plan, the kill, both jobs' exits,
the attempts' last steps and the verdict."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from lab.experiments.kill.torchrun.analysis import TorchrunSummary

__all__ = ["write_files"]


def write_files(summary: TorchrunSummary) -> list[Path]:
    result, verdict = summary.result, summary.verdict
    plan = result.plan
    data = {
        "run_id": result.run_id,
        "ok": verdict.ok,
        "seconds": round(result.seconds, 3),
        "plan": {
            "launcher": "torchrun",
            "mode": plan.mode,
            "rank": plan.rank,
            "at_step": plan.at_step,
            "nodes": plan.nodes,
            "procs_per_node": plan.procs_per_node,
            "max_restarts": plan.max_restarts,
            "run_timeout_s": plan.run_timeout_s,
            "image": plan.image,
            "train": plan.config("fault").to_dict(),
        },
        "kill": asdict(result.kill) if result.kill else None,
        "phases": {
            job.name: {
                "started": job.started,
                "seconds": job.seconds,
                "exit_codes": {str(n): c for n, c in sorted(job.codes.items())},
                "running": job.running,
            }
            for job in (result.reference, result.fault)
        },
        "attempt_steps": {str(r): s for r, s in sorted(result.attempt_steps.items())},
        **verdict.to_dict(),
    }
    path = result.run_dir / "report.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    return [path]
