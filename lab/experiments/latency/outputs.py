"""The files of a sweep in ``runs/<run-id>/``: ``latency.csv``, ``latency.json`` (with the
definitions, the links, every run), ``latency.png``, and at the largest delay ``trace.json``
(every allreduce configuration's representative step) and ``gantt.png`` (the timeline cap,
overlap on vs off), whose per-bucket compute and allreduce times (:mod:`.bucket_stats`) go to
``latency.json`` and the console. Everything is read from the collected rank logs
(``ddp.program.records.load_run``).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ddp.torchfree import load_run
from lab.experiments import timeline
from lab.experiments.latency import figures
from lab.experiments.latency.analysis import Row, derive_rows, phase_groups, summarize
from lab.experiments.latency.bucket_stats import ConfigTiming, time_buckets
from lab.experiments.latency.result import ConfigRun, SweepResult
from lab.experiments.latency.text import DEFINITIONS, Headline, headline

__all__ = [
    "Outputs",
    "combine_rounds",
    "default_timeline_cap",
    "timeline_phase",
    "write_csv",
    "write_json",
    "write_outputs",
]


def _row(result: SweepResult, group: list[ConfigRun]) -> Row:
    """One configuration's row: its rounds' steps pooled from the collected logs, parity
    required in every round."""
    logs = [(str(result.log_dir(run)), load_run(result.log_dir(run))) for run in group]
    stats = summarize(logs, result.plan.warmup)
    parities = [run.parity for run in group]
    run = group[0]
    conf, train = run.conf, (run.phase.train if run.phase else result.plan.train)
    return Row(
        run.ms,
        conf.label,
        conf.cap_mb,
        conf.overlap,
        stats.calls,
        stats.median_step_ms,
        stats.median_comm_ms,
        stats.steps_measured,
        None if None in parities else all(parities),
        phase=run.phase_key,
        accumulate=conf.accumulate,
        samples=train.batch_size * conf.accumulate,
        auto_caps=stats.auto_caps,
    )


def combine_rounds(result: SweepResult) -> list[Row]:
    """One row per (delay, phase, configuration), in run order."""
    groups: dict[tuple[float, str, str], list[ConfigRun]] = {}
    for run in result.runs:
        groups.setdefault((run.ms, run.phase_key, run.conf.name), []).append(run)
    return derive_rows([_row(result, group) for group in groups.values()])


def timeline_phase(rows: Sequence[Row], ms: float) -> str:
    """The phase of the Gantt chart at ``ms``: the first that ran a cap with overlap on and off
    (the default's bandwidth-bound phase), else the last."""
    groups = phase_groups(rows, ms)
    for group in groups:
        if {r.overlap for r in group if r.is_bucketed or r.cap_mb == 0} >= {True, False}:
            return group[0].phase
    return groups[-1][0].phase if groups else ""


def default_timeline_cap(rows: Sequence[Row], ms: float, phase: str = "") -> float | None:
    """The fastest bucketed cap with overlap on at ``ms`` (in ``phase``) among those with
    several buckets (one bucket has nothing to overlap: its allreduce starts when backward
    ends): the configuration a user would pick, shown beside the same cap with overlap off."""
    fixed = [r for r in rows if r.ms == ms and r.phase == phase and r.accumulate == 1]
    fixed = [r for r in fixed if r.is_bucketed or r.cap_mb == 0]
    bucketed = [r for r in fixed if r.cap_mb and r.overlap and r.calls > 1]
    if not bucketed:
        bucketed = [r for r in fixed if r.cap_mb and r.overlap]
    if not bucketed:
        bucketed = fixed
    best = min(bucketed, key=lambda r: r.median_step_ms, default=None)
    return None if best is None else best.cap_mb  # type: ignore[return-value]


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


@dataclass
class Outputs:
    rows: list[Row]
    headlines: list[Headline]
    files: list[Path]
    timings: list[ConfigTiming] = dataclasses.field(default_factory=list)  # the Gantt's pair
    timeline_ms: float | None = None  # the delay of the Gantt chart and its timings


def _title(run: ConfigRun) -> str:
    phase = f"{run.phase.title}, " if run.phase and run.phase_key else ""
    return f"{run.ms:g} ms, {phase}{run.conf.label}"


def _timelines(
    result: SweepResult, ms: float, cap: float | None, phase: str
) -> tuple[list, list, dict, list[ConfigTiming]]:
    """Round 1's allreduce runs at ``ms``: every one's representative step, and the pair of
    ``cap`` in ``phase`` (overlap on, off) for the Gantt chart with its per-bucket timings."""
    traced = [r for r in result.runs if r.ms == ms and r.round == 1 and not r.conf.is_floor]
    lines, pair, steps, timings = [], [], {}, []
    for run in traced:
        logs, where = load_run(result.log_dir(run)), str(result.log_dir(run))
        step = timeline.representative_step(logs, result.plan.warmup, where)
        steps["-".join(k for k in (run.phase_key, run.conf.name) if k)] = step
        lines.append(timeline.load_step(logs, step, _title(run), where, bool(run.conf.overlap)))
        conf = run.conf
        if conf.cap_mb == cap and run.phase_key == phase and conf.accumulate == 1:
            pair.append(lines[-1])
            timings.append(
                time_buckets(logs, result.plan.warmup, conf.label, bool(conf.overlap), where)
            )
    return lines, pair, steps, timings


def _gantt(result: SweepResult, rows: list[Row], files: list[Path]) -> dict:
    """``trace.json`` and ``gantt.png`` at the largest delay (appended to ``files``); what
    they show, for ``latency.json``."""
    plan, run_dir = result.plan, result.run_dir
    ms = max((r.ms for r in rows), default=None)
    if ms is None:
        return {"ms": None, "cap_mb": None, "phase": "", "steps": {}, "timings": []}
    phase = timeline_phase(rows, ms)
    cap = plan.timeline_cap
    if cap is None:
        cap = default_timeline_cap(rows, ms, phase)
    lines, pair, steps, timings = _timelines(result, ms, cap, phase)
    if lines:
        files.append(run_dir / "trace.json")
        files[-1].write_text(json.dumps(timeline.chrome_trace(lines)))
        files.append(run_dir / "gantt.png")
        suptitle = f"one step at {ms:g} ms link delay, {plan.nodes} ranks"
        timeline.write_gantt(files[-1], pair, suptitle=suptitle)
    return {"ms": ms, "cap_mb": cap, "phase": phase, "steps": steps, "timings": timings}


def _phases(result: SweepResult) -> list[dict]:
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
        for p in result.plan.phases()
    ]


def write_outputs(result: SweepResult) -> Outputs:
    """Every file of the sweep, from the collected logs; ValueError if they cannot give them."""
    plan, run_dir = result.plan, result.run_dir
    rows = combine_rounds(result)
    headlines = [headline(rows, ms) for ms in dict.fromkeys(r.ms for r in rows)]
    files = [run_dir / "latency.csv", run_dir / "latency.png"]
    write_csv(files[0], rows)
    figures.plot_sweep(files[1], rows)
    gantt = _gantt(result, rows, files)
    timings = gantt.pop("timings")
    files.append(run_dir / "latency.json")
    plan_doc = {
        f.name: getattr(plan, f.name) for f in dataclasses.fields(plan) if f.name != "train"
    }
    extra = {
        "run_id": result.run_id,
        "settings": {**plan_doc, "train": plan.train.to_dict()},
        "phases": _phases(result),
        "links": [dataclasses.asdict(link) for link in result.links],
        "timeline": gantt,
        "bucket_timings": timings,
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
    write_json(files[-1], rows, headlines, extra)
    return Outputs(rows, headlines, files, timings, gantt["ms"])
