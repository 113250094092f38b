"""What a run of ``lab straggler`` produced, as plain data: both jobs and the slow link's probe
line. Docker-free, so the report and its tests build on it without the engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from lab.experiments.straggler.plan import StragglerPlan

__all__ = ["JobRun", "StragglerResult"]


@dataclass
class JobRun:
    name: str
    codes: dict[int, int]
    parity: bool
    seconds: float


@dataclass
class StragglerResult:
    plan: StragglerPlan
    run_id: str
    run_dir: Path
    jobs: dict[str, JobRun] = field(default_factory=dict)
    link_lines: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def log_dir(self, job: str) -> Path:
        return self.run_dir / job / "logs"
