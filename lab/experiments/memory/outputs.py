"""What ``lab memory`` writes to ``runs/<run-id>/``: ``memory.csv`` (one row per job and rank),
``memory.txt`` (the table and the limit's lines, as printed) and ``memory.json`` (settings,
definitions, every figure, the limit and how each limited job ended). From the run's summary."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path

from lab.experiments.memory.analysis import DEFINITIONS, MemorySummary, RankRow
from lab.experiments.memory.result import JobRun
from lab.experiments.memory.text import format_table, headline_line

__all__ = ["write_files"]


def _num(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, 3)


def _row(r: RankRow) -> dict[str, object]:
    return {
        "job": r.job,
        "rank": r.rank,
        "peak_rss_mib": _num(r.peak_rss_mib),
        "node_peak_mib": _num(r.node_peak_mib),
        "optimizer_state_mb": _num(r.optimizer_state_mb),
        "link_mb_per_step": _num(r.link_mb_per_step),
        "step_ms": _num(r.step_ms),
    }


def _limited(run: JobRun) -> dict[str, object]:
    return {
        "codes": {str(k): c for k, c in run.codes.items()},
        "parity": run.parity,
        "finished": run.finished,
        "oom_nodes": run.oom_nodes,
        "memory": {str(n): dataclasses.asdict(m) for n, m in run.memory.items()},
        "seconds": round(run.seconds, 1),
    }


def write_files(s: MemorySummary) -> list[Path]:
    """Every file of the run; the paths written."""
    result, plan = s.result, s.result.plan
    run_dir = result.run_dir
    rows = [_row(r) for job in s.jobs.values() for r in job.rows]
    files = [run_dir / "memory.csv"]
    with open(files[0], "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    text = [format_table(s)]
    if s.limit is not None:
        text += s.limit.lines()
    text.append(headline_line(s))
    files.append(run_dir / "memory.txt")
    files[-1].write_text("\n".join(text) + "\n")
    files.append(run_dir / "memory.json")
    settings = {
        f.name: str(v) if isinstance(v := getattr(plan, f.name), Path) else v
        for f in dataclasses.fields(plan)
        if f.name != "train"
    }
    settings["train"] = plan.train.to_dict()
    lim = s.limit
    doc = {
        "run_id": result.run_id,
        "settings": settings,
        "definitions": DEFINITIONS,
        "rows": rows,
        "jobs": {
            n: {
                "job_step_ms": _num(j.job_step_ms),
                "link_mb_per_step": _num(j.link_mb_per_step),
                "optimizer_state_mb_max": _num(j.state_mb),
                "steps_measured": j.steps_measured,
                "parity": j.parity,
            }
            for n, j in s.jobs.items()
        },
        "ratios": {k: _num(v) for k, v in dataclasses.asdict(s.ratios).items()},
        "limit": None
        if lim is None
        else {
            "mib": {str(n): v for n, v in lim.limits.items()},
            "ddp_killed": lim.ddp_killed,
            "sharded_fits": lim.sharded_fits,
            "ddp": _limited(lim.ddp),
            "sharded": _limited(lim.sharded),
        },
        "limit_error": result.limit_error,
        "headline": headline_line(s),
        "seconds": round(result.seconds, 1),
        "files": [f.name for f in files],
    }
    files[-1].write_text(json.dumps(doc, indent=2) + "\n")
    return files
