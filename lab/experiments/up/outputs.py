"""``lab up``'s ``summary.json``, from the run's summary: the layout, exits, resources, the
median step and the verdict."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from lab.experiments.up.analysis import UpSummary

__all__ = ["summary_dict", "write_files"]


def summary_dict(summary: UpSummary) -> dict:
    result = summary.result
    plan, s = result.plan, result.sampler
    return {
        "run_id": result.run_id,
        "name": plan.name,
        "layout": dataclasses.asdict(plan.layout),
        "train": plan.train.to_dict(),
        "launcher": plan.launcher,  # torchrun: exit codes, cpu and memory are per node
        "placement": {f"node{n}": r for n, r in sorted(result.placement.items())},
        "exit_codes": {str(r): c for r, c in sorted(result.codes.items())},
        "training_s": round(result.training_s, 3),
        "total_s": round(result.total_s, 3),
        "median_step_ms": summary.median_step_ms,
        "parity_holds": result.holds,
        "verdict": result.verdict,
        "containers": {n: dataclasses.asdict(u) for n, u in s.containers.items()},
        "ranks": {
            str(r): {"cpu_s": cpu, "peak_rss_mib": mib}
            for r, (cpu, mib) in sorted(result.usage.items())
        },
        "host_cpus": os.cpu_count(),
        "host_cpu_percent_mean": s.mean_host_cpu_percent(),
    }


def write_files(summary: UpSummary) -> list[Path]:
    """``summary.json`` (the page's common fields are merged into it afterwards)."""
    path = summary.result.run_dir / "summary.json"
    path.write_text(json.dumps(summary_dict(summary), indent=2))
    return [path]
