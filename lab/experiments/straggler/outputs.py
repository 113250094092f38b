"""What ``lab straggler`` writes to ``runs/<run-id>/``: ``straggler.csv``, ``straggler.json``,
``trace.json`` (Chrome trace) and ``gantt.png`` (one representative step, unslowed above,
slowed below: the fast ranks' yellow "allreduce wait" bar is the time they spend waiting for
the straggler). From the run's summary."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

from lab.experiments import timeline
from lab.experiments.straggler.analysis import DEFINITIONS, RankRow, StragglerSummary

__all__ = ["write_files"]

_FIGURES = (
    "compute_ms",
    "waiting_ms",
    "step_ms",
    "baseline_compute_ms",
    "baseline_waiting_ms",
    "baseline_step_ms",
)


def _row(r: RankRow) -> dict[str, object]:
    return {
        "rank": r.rank,
        "straggler": r.straggler,
        **{k: round(getattr(r, k), 3) for k in _FIGURES},
        "vs_baseline": round(r.vs_baseline, 3),
    }


def write_files(s: StragglerSummary) -> list[Path]:
    """Every file of the run; the paths written."""
    result, summary = s.result, s.figures
    plan, run_dir = result.plan, result.run_dir
    files = [run_dir / "straggler.csv"]
    with open(files[0], "w", newline="") as f:
        rows = [_row(r) for r in summary.rows]
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    files.append(run_dir / "trace.json")
    files[-1].write_text(json.dumps(timeline.chrome_trace(s.traced)))
    files.append(run_dir / "gantt.png")
    timeline.write_gantt(
        files[-1],
        s.traced,
        suptitle=f"one step, {plan.nodes} ranks: yellow after backward = waiting for the slowest",
    )
    files.append(run_dir / "straggler.json")
    settings = {
        f.name: str(v) if isinstance(v := getattr(plan, f.name), Path) else v
        for f in dataclasses.fields(plan)
        if f.name != "train"
    }
    settings |= {
        "quota_cpus": plan.quota,
        "train": plan.train.to_dict(),
        "impair": dataclasses.asdict(plan.impair),
    }
    doc = {
        "run_id": result.run_id,
        "settings": settings,
        "definitions": DEFINITIONS,
        "rows": [_row(r) for r in summary.rows],
        "job_step_ms": summary.job_step_ms,
        "baseline_job_step_ms": summary.baseline_job_step_ms,
        "job_step_x": summary.job_x,
        "straggler_compute_x": summary.straggler_compute_x,
        "others_waiting_ms": summary.others_waiting_ms,
        "links": result.link_lines,
        "timeline_steps": s.steps,
        "jobs": {n: dataclasses.asdict(j) for n, j in result.jobs.items()},
        "seconds": round(result.seconds, 1),
        "files": [f.name for f in files],
    }
    files[-1].write_text(json.dumps(doc, indent=2) + "\n")
    return files
