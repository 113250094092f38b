"""The runs in a runs folder, newest first, each read from its ``summary.json``: what
``python -m lab runs`` lists, shows and compares. A folder without a readable summary (a run
that was interrupted, a partial copy, something else entirely) is listed as such, with what
its files say, and never stops the list."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from lab.report.summary import RunSummary, read_summary

__all__ = ["RunEntry", "find_run", "scan_runs"]

# An experiment's own files, for naming the experiment of a run without a summary.
_MARKERS = {
    "latency.json": "latency",
    "straggler.json": "straggler",
    "compress.json": "compress",
    "memory.json": "memory",
    "report.json": "kill",
    "topology.yaml": "up",
    "bench.json": "ddp.bench",
}


@dataclass
class RunEntry:
    """One folder of the runs folder: its summary, or why there is none (``problem``)."""

    path: Path
    summary: RunSummary | None
    problem: str = ""

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def experiment(self) -> str:
        if self.summary is not None:
            return self.summary.experiment
        found = [exp for name, exp in _MARKERS.items() if (self.path / name).exists()]
        return f"{found[0]}?" if found else "?"

    @property
    def when(self) -> float:
        """For sorting: when it started, else the folder's last change."""
        if self.summary is not None:
            try:
                return datetime.fromisoformat(self.summary.started).timestamp()
            except (TypeError, ValueError):
                pass
        try:
            return self.path.stat().st_mtime
        except OSError:
            return 0.0


def _bench_summary(path: Path) -> RunSummary:
    """``python -m ddp.bench --out DIR`` writes ``bench.json`` (ddp knows nothing of the lab's
    summaries): its targets as a summary, so the runs list shows a bench beside the runs."""
    doc = json.loads((path / "bench.json").read_text())
    ratios = {k: v for k, v in doc["ratios"].items() if v.get("ratio") is not None}
    figure = ", ".join(
        f"{k.removesuffix(' step time')} {v['ratio']:.3f}" for k, v in ratios.items()
    )
    missed = [k for k, v in ratios.items() if not v["met"]]
    verdict = f"targets not met: {'; '.join(missed)}" if missed else "every target met"
    started = datetime.fromtimestamp((path / "bench.json").stat().st_mtime)
    configs = {k: float(v) for k, v in doc.get("medians_ms", {}).get("multi", {}).items()}
    return RunSummary(
        "ddp.bench",
        path.name,
        str(doc["command"]),
        started.isoformat(timespec="seconds"),
        0.0,
        figure,
        verdict,
        not missed,
        configs,
    )


def _entry(path: Path) -> RunEntry:
    try:
        return RunEntry(path, read_summary(path))
    except ValueError as e:
        if (path / "bench.json").is_file() and not (path / "summary.json").exists():
            try:
                return RunEntry(path, _bench_summary(path))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as bad:
                return RunEntry(path, None, f"bench.json unreadable ({type(bad).__name__})")
        return RunEntry(path, None, str(e))


def scan_runs(runs_dir: Path) -> list[RunEntry]:
    """Every folder in ``runs_dir``, newest first (empty if ``runs_dir`` does not exist)."""
    try:
        folders = [p for p in Path(runs_dir).iterdir() if p.is_dir()]
    except OSError:
        return []
    return sorted((_entry(p) for p in folders), key=lambda e: (e.when, e.run_id), reverse=True)


def find_run(runs_dir: Path, run_id: str) -> RunEntry:
    """The run ``run_id`` (a unique prefix is enough); ValueError naming what is wrong."""
    path = Path(runs_dir) / run_id
    if run_id and "/" not in run_id and path.is_dir():
        return _entry(path)
    matches = [e for e in scan_runs(runs_dir) if e.run_id.startswith(run_id)] if run_id else []
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ValueError(
            f"run id {run_id!r} is ambiguous in {runs_dir}/: "
            f"{', '.join(e.run_id for e in matches[:5])}"
        )
    raise ValueError(f"no run {run_id!r} in {runs_dir}/ (python -m lab runs lists them)")
