"""What a run of ``lab topology`` produced, as plain data: every verified link, every job with
each node's sampled eth0 counters and, where the link changed during it, what the probe said.
Docker-free, so the report and its tests build on it without the engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lab.experiments.link_change import LinkChange
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
    layout: str = ""  # Layout.name of the cluster it was verified on
    what: str = "the link"  # or "after the change, idle" (re-verified after a job)

    @classmethod
    def from_report(cls, rep: Any, layout: str = "", what: str = "the link") -> LinkInfo:
        """From :class:`lab.shaping.link.ShapingReport`."""
        kinds = ("baseline", "measured", "bulk")
        probed = {k: dict(getattr(rep, k)) for k in kinds}
        return cls(rep.shaper, rep.line(), rep.note, probed, layout, what)

    def figure(self, kind: str, key: str) -> float | None:
        """e.g. ``figure("measured", "p50_ms")``; None where the probe did not measure it."""
        return self.probed.get(kind, {}).get(key)


@dataclass
class ConfigRun:
    """One job: a configuration in one round of a layout; how its ranks exited, ddp's
    verdict, every node's eth0 samples (``"<time> <tx> <rx>"`` lines, :mod:`.counters`) and
    the change of its link (None: none during it)."""

    conf: str  # Configuration.name
    round: int
    job: str
    codes: dict[int, int]
    parity: bool
    seconds: float
    counters: dict[int, str] = field(default_factory=dict)
    layout: str = "2x2"  # Layout.name
    change: LinkChange | None = None


@dataclass
class TopologyResult(SweepResult[TopologyPlan, LinkInfo, ConfigRun]):
    """The run: every verified link, every job in run order, layout by layout; ``cpus``: the
    cores of the host the ranks shared."""

    cpus: int | None = None
