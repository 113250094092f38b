"""The files of a ``lab compress`` run in ``runs/<run-id>/``: ``compress.txt`` (the table and
the crossover), ``compress.csv``, ``compress.json`` (definitions, settings, links, every job),
``compress.png`` and ``trace.json`` (one representative step of every hook at the lowest rate,
from the step records' bucket timings). Everything is read from the collected rank logs
(``ddp.program.records.load_run``)."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

from ddp.torchfree import load_run
from lab.experiments import timeline
from lab.experiments.compress import figures
from lab.experiments.compress.analysis import (
    DEFINITIONS,
    Crossover,
    Row,
    crossovers,
    derive_rows,
    job_figures,
    make_row,
)
from lab.experiments.compress.result import CompressResult, HookRun
from lab.experiments.compress.text import crossover_lines, format_table

__all__ = ["Outputs", "combine_rounds", "write_outputs"]


def combine_rounds(result: CompressResult) -> list[Row]:
    """One row per (rate, hook), lowest rate first: steps pooled over its rounds from the
    collected logs."""
    groups: dict[tuple[float, str], list[HookRun]] = {}
    for run in sorted(result.runs, key=lambda run: run.rate_mbit):  # stable: hook order kept
        groups.setdefault((run.rate_mbit, run.hook), []).append(run)
    rows = []
    for (rate, hook), group in groups.items():
        jobs = [
            job_figures(load_run(result.log_dir(run)), result.plan.warmup, str(result.log_dir(run)))
            for run in group
        ]
        sent = [max(run.tx_bytes.values()) / 1e6 for run in group if run.tx_bytes]
        parity = all(run.parity for run in group)
        rows.append(make_row(rate, hook, jobs, sent, parity, result.plan.train.steps))
    return derive_rows(rows)


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


def _trace(result: CompressResult) -> dict | None:
    """Round 1 at the lowest rate: every hook's step closest to its median."""
    lowest = min(result.plan.rates)
    lines = []
    for run in result.runs:
        if run.rate_mbit != lowest or run.round != 1:
            continue
        logs, where = load_run(result.log_dir(run)), str(result.log_dir(run))
        step = timeline.representative_step(logs, result.plan.warmup, where)
        lines.append(timeline.load_step(logs, step, f"{lowest:g} Mbit/s, {run.hook}", where))
    return timeline.chrome_trace(lines) if lines else None


@dataclass
class Outputs:
    rows: list[Row]
    crossovers: list[Crossover]
    files: list[Path]


def write_outputs(result: CompressResult) -> Outputs:
    """Every file of the run; ValueError if the logs cannot give them."""
    plan, run_dir = result.plan, result.run_dir
    rows = combine_rounds(result)
    cs = crossovers(rows)
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
    trace = _trace(result)
    if trace is not None:
        path("trace.json").write_text(json.dumps(trace))
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
    return Outputs(rows, cs, files)
