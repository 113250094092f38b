"""Every run's ``summary.json``: the few fields ``python -m lab runs`` lists and compares,
written by each experiment from its result objects beside its other outputs.

One schema for every experiment, so the runs list reads one file per run and never an
experiment's own JSON. ``lab up`` already wrote a ``summary.json`` of its own: the common
fields are merged into it (its ``verdict`` is the same line), its other keys kept.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["SUMMARY_NAME", "RunSummary", "read_summary", "started_at", "write_summary"]

SUMMARY_NAME = "summary.json"


@dataclass
class RunSummary:
    """``figure`` is the headline (e.g. ``bucketing 1.7x, overlap 1.4x``); ``configs`` maps
    each configuration to its median step time in ms, what ``--compare`` sets side by side;
    ``ok`` None: the run ended before it could be judged."""

    experiment: str
    run_id: str
    command: str
    started: str  # ISO 8601, local time
    seconds: float
    figure: str
    verdict: str
    ok: bool | None
    configs: dict[str, float] = field(default_factory=dict)


def started_at(seconds: float) -> str:
    """When a run that took ``seconds`` and just ended started (local time, to the second)."""
    return datetime.fromtimestamp(time.time() - seconds).isoformat(timespec="seconds")


def write_summary(run_dir: Path, summary: RunSummary) -> Path:
    """Write (or merge into an existing) ``run_dir/summary.json``."""
    path = Path(run_dir) / SUMMARY_NAME
    doc: dict[str, Any] = {}
    try:
        old = json.loads(path.read_text())
        doc = old if isinstance(old, dict) else {}
    except (OSError, ValueError):
        pass
    doc.update(dataclasses.asdict(summary))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def read_summary(run_dir: Path) -> RunSummary:
    """A run's summary; ValueError saying what is wrong with it (missing, not JSON, a field
    missing or of the wrong kind)."""
    path = Path(run_dir) / SUMMARY_NAME
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError("no summary.json (interrupted, or written before summaries)") from None
    except (OSError, ValueError) as e:
        raise ValueError(f"summary.json unreadable ({type(e).__name__})") from None
    if not isinstance(doc, dict):
        raise ValueError("summary.json is not an object")
    names = [f.name for f in dataclasses.fields(RunSummary)]
    missing = [n for n in names if n not in doc and n != "configs"]
    if missing:
        raise ValueError(f"summary.json lacks {', '.join(missing)}")
    try:
        summary = RunSummary(**{n: doc[n] for n in names if n in doc})
        summary.seconds = float(summary.seconds)
        summary.configs = {str(k): float(v) for k, v in dict(summary.configs).items()}
    except (TypeError, ValueError):
        raise ValueError("summary.json has a field of the wrong kind") from None
    return summary
