"""The files of a sweep in ``runs/<run-id>/``, from its summary: ``latency.csv``,
``latency.json`` (with the definitions, the links, every run, the per-bucket timings),
``latency.png``, and at the largest delay ``trace.json`` (every allreduce configuration's
representative step) and ``gantt.png`` (the timeline cap, overlap on vs off).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path

from lab.experiments import timeline
from lab.experiments.latency import figures
from lab.experiments.latency.analysis import DEFINITIONS, Headline, LatencySummary, Row

__all__ = ["write_csv", "write_files", "write_json"]


def _blank(value: object) -> object:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _csv_row(r: Row) -> dict[str, object]:
    return {
        "ms": r.ms,
        "config": r.config,
        "bucket_cap_mb": _blank(r.cap_mb),
        "overlap": _blank(r.overlap),
        "allreduce_calls_per_step": r.calls,
        "median_step_ms": round(r.median_step_ms, 3),
        "exposed_comm_ms": _blank(round(r.exposed_comm_ms, 3)),
        "median_comm_wait_ms": round(r.median_comm_ms, 3),
        "speedup_vs_per_parameter": _blank(round(r.speedup_vs_per_parameter, 3)),
        "parity": r.parity_text,
        "steps_measured": r.steps_measured,
        "phase": r.phase,
        "accumulate": r.accumulate,
        "samples_per_step": r.samples,
        "comm_ms_per_sample": _blank(round(r.comm_ms_per_sample, 6)),
        "auto_cap_mb": ";".join(f"{c:g}" for c in r.auto_caps),
    }


def write_csv(path: Path, rows: list[Row]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(_csv_row(rows[0])) if rows else [])
        writer.writeheader()
        writer.writerows(_csv_row(r) for r in rows)


def _jsonable(value: object) -> object:
    # NaN is not JSON; null says "not measured" honestly.
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))  # e.g. the plan's Impairments
    return value


def write_json(path: Path, rows: list[Row], headlines: list[Headline], extra: dict) -> None:
    """``extra`` carries the run's plan, link measurements and file names."""
    doc = {
        **extra,
        "definitions": DEFINITIONS,
        "rows": [dataclasses.asdict(r) for r in rows],
        "headline": [dataclasses.asdict(h) for h in headlines],
    }
    path.write_text(json.dumps(_jsonable(doc), indent=2) + "\n")


def _phases(summary: LatencySummary) -> list[dict]:
    return [
        {
            "key": p.key,
            "title": p.title,
            "ms": p.ms,
            "rate_mbit": p.rate_mbit,
            "lesson": p.lesson,
            "train": p.train.to_dict(),
            "configurations": [c.label for c in p.configurations],
        }
        for p in summary.result.plan.phases()
    ]


def write_files(summary: LatencySummary) -> list[Path]:
    """Every file of the sweep; the paths written."""
    result, rows, gantt = summary.result, summary.rows, summary.gantt
    plan, run_dir = result.plan, result.run_dir
    files = [run_dir / "latency.csv", run_dir / "latency.png"]
    write_csv(files[0], rows)
    figures.plot_sweep(files[1], rows)
    if gantt.traced:
        files.append(run_dir / "trace.json")
        files[-1].write_text(json.dumps(timeline.chrome_trace(gantt.traced)))
        files.append(run_dir / "gantt.png")
        suptitle = f"one step at {gantt.ms:g} ms link delay, {plan.nodes} ranks"
        timeline.write_gantt(files[-1], gantt.pair, suptitle=suptitle)
    files.append(run_dir / "latency.json")
    plan_doc = {
        f.name: getattr(plan, f.name) for f in dataclasses.fields(plan) if f.name != "train"
    }
    extra = {
        "run_id": result.run_id,
        "settings": {**plan_doc, "train": plan.train.to_dict()},
        "phases": _phases(summary),
        "links": [dataclasses.asdict(link) for link in result.links],
        "timeline": {
            "ms": gantt.ms,
            "cap_mb": gantt.cap_mb,
            "phase": gantt.phase,
            "steps": gantt.steps,
        },
        "bucket_timings": gantt.timings,
        "runs": [
            {
                "name": run.job,
                "phase": run.phase_key,
                "seconds": round(run.seconds, 1),
                "exit_codes": run.codes,
                "median_step_ms": run.stats.median_step_ms,
            }
            for run in result.runs
        ],
        "seconds": round(result.seconds, 1),
        "files": [f.name for f in files],
    }
    write_json(files[-1], rows, summary.headlines, extra)
    return files
