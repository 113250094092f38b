"""What ``lab run``'s run hands to its report: plain data, Docker-free, so the analysis and its
tests build on synthetic values as well as on a real run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from lab.experiments.run.plan import RunPlan

__all__ = ["FaultEvent", "RunResult", "StepSeen"]


@dataclass(frozen=True)
class StepSeen:
    """One step record as the lab followed it: ``t`` its end (wall clock), ``step_ms`` its
    duration; ``nbytes`` what the rank's allreduces moved in it (None: not reported)."""

    rank: int
    step: int
    t: float
    step_ms: float
    nbytes: int | None = None
    allreduces: int | None = None


@dataclass(frozen=True)
class FaultEvent:
    """A fault landing (or lifting): seconds from the job's start, and what was done."""

    at_s: float
    text: str


@dataclass
class RunResult:
    plan: RunPlan
    run_id: str
    run_dir: Path
    started: float = 0.0  # the job's start, wall clock
    seconds: float = 0.0
    steps: list[StepSeen] = field(default_factory=list)
    exits: dict[int, int] = field(default_factory=dict)  # node -> torchrun's exit code
    running: list[int] = field(default_factory=list)  # nodes still running when it was stopped
    faults: list[FaultEvent] = field(default_factory=list)
    diagnosis: str | None = None  # the one line, when the job hung or failed
    digests: dict[int, str] = field(default_factory=dict)  # rank -> final parameters' digest
    counters: dict[int, str] = field(default_factory=dict)  # node -> eth0 samples ("t tx rx")
    links: list[str] = field(default_factory=list)  # the probe's line per link set
    ranks_seen: set[int] = field(default_factory=set)
    image: str = ""

    @property
    def clean(self) -> bool:
        return not self.running and bool(self.exits) and all(c == 0 for c in self.exits.values())
