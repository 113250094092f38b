"""What a sweep produced, as plain data: the verified links and every configuration's run.

Docker-free, so the report and its tests build on it without the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from lab.experiments.latency.plan import Configuration, LatencyPlan, Phase
from lab.experiments.link_change import LinkChange, Recovery
from lab.report.report import SweepResult as _Sweep

__all__ = ["ConfigRun", "ConfigStats", "LinkReport", "SweepResult"]


@dataclass(frozen=True)
class ConfigStats:
    """What one configuration's logs say, before comparing it with the others."""

    calls: int  # allreduce calls per measured step (the plan is rebuilt after step 1)
    median_step_ms: float
    median_comm_ms: float  # slowest rank's wait for allreduces after backward, median
    steps_measured: int
    auto_caps: tuple[float, ...] = ()  # bucket_cap_mb="auto": the cap chosen, per run


@dataclass
class LinkReport:
    """The verified link of one delay, or of one phase (``phase``: its key) in a two-phase
    sweep (``shaper`` "none" when nothing was shaped)."""

    ms: float
    shaper: str
    note: str = ""
    line: str = ""
    rtt_p50_ms: float | None = None
    rtt_p90_ms: float | None = None
    baseline_p50_ms: float | None = None
    phase: str = ""


@dataclass
class ConfigRun:
    """One run (one round) of one configuration: its job, how its ranks exited, and this run's
    statistics (from the records the ranks streamed; the report re-reads the collected logs)."""

    conf: Configuration
    ms: float
    round: int
    job: str
    codes: dict[int, int]
    stats: ConfigStats
    parity: bool | None  # None for the floor: replicas drift by design
    seconds: float
    phase: Phase | None = None  # None: a single-phase sweep's run (before phases existed)
    change: LinkChange | None = None  # --change-at-step: what happened to the link
    recovery: Recovery | None = None  # and the steps around it

    @property
    def phase_key(self) -> str:
        return self.phase.key if self.phase else ""


class SweepResult(_Sweep[LatencyPlan, LinkReport, ConfigRun]):
    """The sweep: the verified link of every delay, every configuration's run in run order."""
