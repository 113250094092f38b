"""The files of a ``lab compress`` run in ``runs/<run-id>/``, from its summary: ``compress.txt``
(the table and the crossover), ``compress.csv``, ``compress.json`` (definitions, settings,
links, every job), ``compress.png`` and ``trace.json`` (one representative step of every hook at
the lowest rate, from the step records' bucket timings)."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path

from lab.experiments import timeline
from lab.experiments.compress import figures
from lab.experiments.compress.analysis import DEFINITIONS, CompressSummary, Row
from lab.experiments.compress.text import crossover_lines, format_table

__all__ = ["write_csv", "write_files"]


def _blank(value: object) -> object:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _jsonable(value: object) -> object:
    if isinstance(value, float) and math.isnan(value):
        return None  # null: not measured
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def write_csv(path: Path, rows: list[Row]) -> None:
    names = [f.name for f in dataclasses.fields(Row)]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=names)
        writer.writeheader()
        writer.writerows({k: _blank(v) for k, v in dataclasses.asdict(r).items()} for r in rows)


def write_files(summary: CompressSummary) -> list[Path]:
    """Every file of the run; the paths written."""
    result, rows, cs = summary.result, summary.rows, summary.crossovers
    plan, run_dir = result.plan, result.run_dir
    files = []

    def path(name: str) -> Path:
        files.append(run_dir / name)
        return files[-1]

    table = format_table(rows, plan, result.links)
    path("compress.txt").write_text("\n".join([table, *crossover_lines(cs)]) + "\n")
    write_csv(path("compress.csv"), rows)
    delay = f", {plan.ms:g} ms one-way delay" if plan.ms else ""
    figures.plot_compress(
        path("compress.png"),
        rows,
        cs,
        f"{plan.nodes} ranks, model {plan.train.model}, gradient compression "
        f"under a bandwidth cap{delay}",
    )
    if summary.traced:
        path("trace.json").write_text(json.dumps(timeline.chrome_trace(summary.traced)))
    settings = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)}
    settings["train"] = plan.train.to_dict()
    doc = {
        "run_id": result.run_id,
        "settings": settings,
        "definitions": DEFINITIONS,
        "links": [dataclasses.asdict(link) for link in result.links],
        "rows": [dataclasses.asdict(r) for r in rows],
        "crossovers": [
            {**dataclasses.asdict(c), "lowest": c.lowest, "highest": c.highest} for c in cs
        ],
        "runs": [dataclasses.asdict(run) for run in result.runs],
        "seconds": round(result.seconds, 1),
        "files": [f.name for f in files] + ["compress.json"],
    }
    path("compress.json").write_text(json.dumps(_jsonable(doc), indent=2) + "\n")
    return files
