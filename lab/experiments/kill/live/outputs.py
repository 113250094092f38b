"""``lab kill --recovery live``'s ``live.json``, from the run's summary: the plan, the lab's
moments, the figures, every path's row, the exit codes and the verdict."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from lab.experiments.kill.live.analysis import LiveSummary
from lab.experiments.kill.live.text import LEGEND, headline

__all__ = ["FILE", "write_files"]

FILE = "live.json"


def write_files(summary: LiveSummary) -> list[Path]:
    result = summary.result
    doc = {
        "run_id": result.run_id,
        "plan": {k: str(v) for k, v in dataclasses.asdict(result.plan).items()},
        "moments": [dataclasses.asdict(m) for m in result.moments],
        "figures": dict(summary.figures),
        "paths": [dataclasses.asdict(r) for r in summary.rows],
        "definitions": LEGEND,
        "exit_codes": result.codes,
        "restart_run": result.restart.run_id if result.restart else None,
        "torchft_run": result.torchft.run_id if result.torchft else None,
        "ok": summary.ok,
        "verdict": summary.verdict.lines,
        "headline": headline(summary),
    }
    path = result.run_dir / FILE
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return [path]
