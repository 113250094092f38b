"""``lab latency``'s plan: the link delays, the phases and configurations run at each, and the
training config of every one of them, validated before any container exists.

Configurations differ only in bucket cap, overlap, accumulation and sync mode: each one's
``TrainConfig`` is its phase's base config with those fields replaced (same model, seed, data,
steps and simulated compute). The no-sync floor (no communication at all) runs first in each
round of a phase; it is what "exposed communication" is measured from. A single-phase sweep
(explicit settings) runs one phase per delay; the default (``phased``) two per delay
(:mod:`.phases`). Pure: tested without Docker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ddp.torchfree import TrainConfig
from lab.args import check_finite, check_job, check_warmup
from lab.engine.layout import Layout
from lab.engine.specs import DEFAULT_IMAGE
from lab.experiments.latency.phases import (
    AUTO,
    Configuration,
    Phase,
    default_phases,
    sweep_configurations,
)
from lab.experiments.link_change import ChangePlan
from lab.shaping.impair import Impairments
from lab.shaping.registry import CHOICES

__all__ = [
    "DEFAULT_CAPS",
    "DEFAULT_NODES",
    "DEFAULT_RATE_MBIT",
    "QUICK",
    "TRAIN_DEFAULTS",
    "Configuration",
    "LatencyPlan",
    "Phase",
    "Planned",
    "job_name",
]

# The default runs two phases (.phases): bucketing pays where allreduces are latency-bound, overlap
# where they are bandwidth-bound, and no one workload on this host shows both strongly
# (docs/experiments/latency.md, "Why this default"). What follows are the phases' link and
# model, and a single-phase sweep's defaults (explicit --caps, --rate-mbit, ...).
# Two nodes: on a 2-core host each rank then has a core, and communication is not starved
# during backward (with four ranks it is). The rate cap makes the 1.1 MB of the tower's
# gradients take ~470 ms of allreduce at 20 Mbit/s, serial. The single-phase batch: on this
# host the tower's real backward takes ~350-460 ms at 512, ~650 ms at 768, 1.3-1.7 s at 2048
# (once ~400 ms on a faster host), and it varies up to 2x between steps.
DEFAULT_NODES = 2
DEFAULT_RATE_MBIT = 20.0
# 0: one allreduce per tensor (82: the bucketing lesson); 0.15: five convolutions a bucket (7:
# the first fills after 1/6 of backward, the last holds the small first layers); 25: torch's
# default cap, one bucket here, which overlap cannot help.
DEFAULT_CAPS = (0.0, 0.15, 25.0)  # MB
# --quick: one round of fewer steps (a single-phase sweep: per-parameter vs the overlap cap).
QUICK = {"steps": 5, "rounds": 1, "caps": (0.0, 0.15)}
# The collective timeout is well below the run timeout, so a rank that lost a peer says so
# (its diagnosis) before lab stops the configuration.
TRAIN_DEFAULTS = TrainConfig(
    model="tower", steps=6, batch_size=768, seed=0, collective_timeout_s=60.0
)


def job_name(conf: Configuration, ms: float, round_: int, phase: str = "") -> str:
    """The job of one run of a configuration: ``runs/<run-id>/<job>/`` (``phase``: the phase's
    key in a two-phase sweep)."""
    return f"{ms:g}ms-{phase + '-' if phase else ''}{conf.name}-r{round_}"


@dataclass(frozen=True)
class Planned:
    """One job of the sweep, in run order."""

    ms: float
    round: int
    conf: Configuration
    job: str
    train: TrainConfig
    phase: Phase | None = None


@dataclass(frozen=True)
class LatencyPlan:
    """What ``python -m lab latency`` measures, and its bounds."""

    ms: tuple[float, ...] = (5.0,)  # one-way delay per packet
    shaper: str = "auto"
    rate_mbit: float | None = DEFAULT_RATE_MBIT  # None: no rate cap
    caps: tuple[float | str, ...] = DEFAULT_CAPS  # MB, or "auto": the wrapper picks its cap
    warmup: int = 2  # first steps include gloo's connection set-up: not measured
    rounds: int = 2  # the whole plan runs this often, interleaved: load drift hits all alike
    nodes: int = DEFAULT_NODES
    train: TrainConfig = field(default_factory=lambda: TRAIN_DEFAULTS)
    timeline_cap: float | None = None  # None: the fastest bucketed cap with overlap on
    run_timeout_s: float = 300.0  # wall time of one configuration
    image: str = DEFAULT_IMAGE
    runs_dir: Path = Path("runs")
    progress: bool = True
    impair: Impairments = field(default_factory=Impairments)  # jitter, loss on every node
    node_ms: tuple[tuple[int, float], ...] = ()  # (node, ms): a node whose delay differs
    cpus: float | None = None  # every node's CPU limit in cores (None: no limit)
    # The default: two phases per delay (.phases.default_phases; rate_mbit and train are then
    # the bandwidth-bound phase's, caps unused); False: one phase per delay, every cap on/off.
    phased: bool = False
    overlaps: tuple[bool, ...] = (True, False)  # a single-phase sweep's: every cap with each
    change: ChangePlan | None = None  # every node's link changes during every job

    def __post_init__(self) -> None:
        if not self.ms:
            raise ValueError("give at least one --ms value")
        nodes = [n for n, _ in self.node_ms]
        if any(not 0 <= n < self.nodes for n in nodes) or len(set(nodes)) != len(nodes):
            raise ValueError(
                f"--node-ms names nodes {nodes}: each at most once, and the nodes are "
                f"0..{self.nodes - 1}"
            )
        for ms in self.ms:
            check_finite("--ms", ms, 0.0)
        if len(set(self.ms)) != len(self.ms):
            raise ValueError(f"--ms values repeat: {list(self.ms)}; give each delay once")
        if self.shaper not in CHOICES:
            raise ValueError(f"--shaper must be one of {', '.join(CHOICES)}, got {self.shaper!r}")
        if self.rate_mbit is not None and not (
            math.isfinite(self.rate_mbit) and self.rate_mbit > 0
        ):
            raise ValueError("--rate-mbit must be a finite number > 0 (--rate-mbit 0: no limit)")
        if not self.caps:
            raise ValueError("--caps is empty; e.g. --caps 0,0.25,1,4,25")
        for cap in self.caps:
            if cap != AUTO:
                check_finite("--caps", cap, 0.0)
        if not self.overlaps or len(set(self.overlaps)) != len(self.overlaps):
            raise ValueError(f"overlaps must be (True,), (False,) or both, got {self.overlaps}")
        if len(set(self.caps)) != len(self.caps):
            raise ValueError(f"--caps values repeat: {list(self.caps)}; give each cap once")
        check_warmup(self.warmup, self.train.steps)
        if self.rounds < 1:
            raise ValueError(f"--rounds must be an integer >= 1, got {self.rounds!r}")
        if self.nodes < 2:
            raise ValueError(f"--nodes must be >= 2 (a link needs two ends), got {self.nodes}")
        if self.timeline_cap is not None and self.timeline_cap not in self.caps:
            raise ValueError(
                f"--timeline-cap {self.timeline_cap:g} is not one of --caps "
                f"{','.join(str(c) if c == AUTO else f'{c:g}' for c in self.caps)}"
            )
        if self.cpus is not None and not (math.isfinite(self.cpus) and self.cpus > 0):
            raise ValueError(
                f"--cpus must be a finite number > 0 (cores per node), got {self.cpus!r}"
            )
        for phase in self.phases():
            check_job(phase.train, self.run_timeout_s, self.nodes, "configuration")
            if self.change is not None:
                self.change.check(phase.train.steps, self.warmup)
        if self.change is not None and (self.impair or self.node_ms):
            raise ValueError(
                "--change-at-step changes every node's delay and rate alike; it does not "
                "combine with --node-ms or the impairments (--jitter-ms, --loss-pct)"
            )

    @property
    def layout(self) -> Layout:
        return Layout(self.nodes, 1)

    def phases(self) -> list[Phase]:
        """Every phase, in run order: per delay, the default's two phases (``phased``), or one
        phase of every cap with overlap on and off on the plan's link."""
        if self.phased:
            return [p for ms in self.ms for p in default_phases(ms, self.train, self.rate_mbit)]
        confs = sweep_configurations(self.caps, self.overlaps)
        return [Phase(ms, self.rate_mbit, self.train, confs) for ms in self.ms]

    def configurations(self) -> list[Configuration]:
        """The configurations of every phase at a delay, in order (the floor first)."""
        return [c for p in self.phases() if p.ms == self.ms[0] for c in p.configurations]

    def jobs(self, setting: Phase | float) -> list[Planned]:
        """The jobs of one phase (or of a single-phase sweep's delay): every round runs every
        configuration, interleaved, so slow drift of the host's load hits all alike."""
        phase = setting
        if not isinstance(phase, Phase):
            confs = sweep_configurations(self.caps, self.overlaps)
            phase = Phase(setting, self.rate_mbit, self.train, confs)
        return [
            Planned(
                phase.ms,
                r,
                c,
                job_name(c, phase.ms, r, phase.key),
                c.train_config(phase.train),
                phase,
            )
            for r in range(1, self.rounds + 1)
            for c in phase.configurations
        ]

    @property
    def total(self) -> int:
        return self.rounds * sum(len(p.configurations) for p in self.phases())
