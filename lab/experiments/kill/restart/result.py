"""What a ``lab kill`` run hands to its report: plain data, so the report is built and tested
from synthetic values as well as from a real run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ddp.torchfree import FailureRecord, RankLog
from lab.engine.events import ExitEvent
from lab.experiments.kill.restart.plan import KillPlan

__all__ = ["Injection", "KillResult", "PhaseOutcome"]


@dataclass(frozen=True)
class Injection:
    """Lab's record of the fault: what it did and when (host ``time.time()``)."""

    mode: str
    rank: int
    node: int
    trigger: str  # what lab saw, e.g. "rank 2 reported step 4 done"
    trigger_time: float  # when that record arrived
    start: float  # just before the Docker call
    end: float  # when it returned: the fault is in place
    detail: str = ""  # e.g. the addresses a partition cut off


@dataclass
class PhaseOutcome:
    """How one phase's ranks ended: exits, and the failures (diagnoses) they reported."""

    name: str
    started: float  # host time the job was started
    exits: dict[int, ExitEvent] = field(default_factory=dict)
    failures: dict[int, tuple[float, FailureRecord]] = field(default_factory=dict)  # rank ->
    # (arrival time, record)

    @property
    def codes(self) -> dict[int, int]:
        return {r: e.code for r, e in sorted(self.exits.items())}


@dataclass
class KillResult:
    plan: KillPlan
    run_id: str
    run_dir: Path
    phases: dict[str, PhaseOutcome]
    injection: Injection | None
    dumps: dict[int, dict]  # the fault phase's flight dumps, by rank
    logs: dict[
        str, dict[int, RankLog]
    ]  # phase -> rank -> its records (ddp.program.records.load_run)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0  # containers created to removed
