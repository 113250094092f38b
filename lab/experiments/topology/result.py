"""What a run of ``lab topology`` produced, as plain data: the verified link and every job,
with each node's sampled eth0 counters. Docker-free, so the report and its tests build on it
without the engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lab.experiments.reporting import SweepResult
from lab.experiments.topology.plan import TopologyPlan

__all__ = ["ConfigRun", "LinkInfo", "TopologyResult"]


@dataclass
class LinkInfo:
    """The verified link between the nodes: the probe's line, and its figures as it gave them
    (``probed``: "baseline" and "measured" round trips in ms, "bulk" with ``--rate-mbit``)."""

    shaper: str
    line: str
    note: str = ""
    probed: dict[str, dict[str, float]] = field(default_factory=dict)

    @classmethod
    def from_report(cls, rep: Any) -> LinkInfo:
        """From :class:`lab.shaping.link.ShapingReport`."""
        kinds = ("baseline", "measured", "bulk")
        return cls(rep.shaper, rep.line(), rep.note, {k: dict(getattr(rep, k)) for k in kinds})

    def figure(self, kind: str, key: str) -> float | None:
        """e.g. ``figure("measured", "p50_ms")``; None where the probe did not measure it."""
        return self.probed.get(kind, {}).get(key)


@dataclass
class ConfigRun:
    """One job: a configuration in one round; how its ranks exited, ddp's verdict, and every
    node's eth0 samples (``"<time> <tx> <rx>"`` lines, :mod:`.counters`)."""

    conf: str  # Configuration.name
    round: int
    job: str
    codes: dict[int, int]
    parity: bool
    seconds: float
    counters: dict[int, str] = field(default_factory=dict)


class TopologyResult(SweepResult[TopologyPlan, LinkInfo, ConfigRun]):
    """The run: its one verified link, every job in run order."""
