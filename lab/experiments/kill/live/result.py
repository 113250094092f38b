"""What a ``lab kill --recovery live`` run hands to its report: plain data, so the report is
built and tested from synthetic records as well as from a real run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ddp.torchfree import RankLog
from lab.experiments.kill.live.plan import LivePlan
from lab.experiments.kill.restart.result import KillResult

__all__ = ["LiveResult", "Moment"]


@dataclass(frozen=True)
class Moment:
    """Something the lab did, on the host's wall clock: ``kind`` "fault" or "replacement"."""

    t: float
    text: str
    kind: str


@dataclass
class LiveResult:
    plan: LivePlan
    run_id: str
    run_dir: Path
    moments: list[Moment]
    logs: dict[str, dict[int, list[RankLog]]]  # job ("live", "rejoin") -> rank -> attempts
    codes: dict[str, dict[int, int]]  # job -> rank (the coordinator: node) -> exit code
    restart: KillResult | None  # the restart path on the same job, when it ran
    seconds: float = 0.0
    torchft: LiveResult | None = None  # the same job under torchft, when it ran
    ended: dict[str, dict[int, float]] = field(default_factory=dict)  # job -> rank -> exit t

    def moment(self, kind: str) -> Moment | None:
        return next((m for m in self.moments if m.kind == kind), None)
