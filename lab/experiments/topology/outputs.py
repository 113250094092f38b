"""The files of a ``lab topology`` run in ``runs/<run-id>/``: ``topology.txt`` (the tables and
the last lines, as printed), ``topology.csv``, ``topology.json`` (definitions, settings, the
links, rows, every job with its measured window and its link change), ``topology.png``, and per
job ``<job>/eth0-node<N>.txt`` (the sampled counters every byte figure comes from). From the
run's summary."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path

from lab.experiments.topology import figures
from lab.experiments.topology.analysis import DEFINITIONS, JobFigures, Row, TopologySummary
from lab.experiments.topology.result import ConfigRun
from lab.experiments.topology.text import closing

__all__ = ["write_files"]


def _plain(value: object) -> object:
    """NaN as null (not measured) in JSON, as an empty cell in CSV."""
    return None if isinstance(value, float) and math.isnan(value) else value


_NESTED = ("recoveries", "plans")  # in the JSON only
_DERIVED = ("before_ms", "after_ms", "steps_to_recover")  # from the recoveries


def _write_csv(path: Path, rows: list[Row]) -> None:
    names = [f.name for f in dataclasses.fields(Row) if f.name not in _NESTED]
    names += list(_DERIVED)
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(names)
        for r in rows:
            values = [_plain(getattr(r, n)) for n in names]
            out.writerow(
                [
                    "" if v is None else "/".join(map(str, v)) if isinstance(v, tuple) else v
                    for v in values
                ]
            )


def _job_doc(run: ConfigRun, figures_: JobFigures) -> dict:
    window = figures_.window
    return {
        "job": run.job,
        "config": run.conf,
        "round": run.round,
        "exit_codes": run.codes,
        "parity": run.parity,
        "seconds": round(run.seconds, 1),
        "steps_measured": figures_.steps,
        "window": None if window is None else dataclasses.asdict(window),
        "layout": run.layout,
        "change": None if run.change is None else dataclasses.asdict(run.change),
        "recovery": None if figures_.recovery is None else dataclasses.asdict(figures_.recovery),
    }


def write_files(summary: TopologySummary) -> list[Path]:
    """Every file of the run; the paths written."""
    result, rows, jobs = summary.result, summary.rows, summary.jobs
    plan, run_dir = result.plan, result.run_dir
    files = [run_dir / f"topology.{ext}" for ext in ("txt", "csv", "png", "json")]
    lines = closing(summary)
    files[0].write_text("\n".join([*lines.table, *lines.after]) + "\n")
    _write_csv(files[1], rows)
    figures.plot_step_times(
        files[2],
        summary.layouts,
        f"{plan.link_text} between nodes, model {plan.train.model}, {plan.cap_text}",
    )
    for run in result.runs:
        for node, text in run.counters.items():
            (run_dir / run.job).mkdir(parents=True, exist_ok=True)
            (run_dir / run.job / f"eth0-node{node}.txt").write_text(text)
    settings = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)}
    settings["layouts"] = [lay.name for lay in plan.layouts]
    settings["change"] = None if plan.change is None else dataclasses.asdict(plan.change)
    doc = {
        "run_id": result.run_id,
        "settings": {**settings, "train": plan.train.to_dict()},
        "definitions": DEFINITIONS,
        "links": [dataclasses.asdict(link) for link in result.links],
        "rows": [
            {k: _plain(v) for k, v in dataclasses.asdict(r).items() if k != "recoveries"}
            | {k: _plain(getattr(r, k)) for k in _DERIVED}
            for r in rows
        ],
        "headlines": lines.after[-len(summary.layouts) :] if summary.layouts else [],
        "headline": lines.after[-1] if lines.after else "",
        "cpus": result.cpus,
        "jobs": [_job_doc(run, jobs[run.job]) for run in result.runs],
        "seconds": round(result.seconds, 1),
        "files": [f.name for f in files],
    }
    files[3].write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return files
