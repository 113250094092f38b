"""``lab latency``'s plan: the link delays, the configurations run at each, and the training
config of every one of them, validated before any container exists.

Configurations differ only in bucket cap, overlap and sync mode: each one's ``TrainConfig`` is
the sweep's base config with those fields replaced (same model, seed, data, steps and simulated
compute). The no-sync floor (no communication at all) runs first in each round; it is what
"exposed communication" is measured from. Pure: tested without Docker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ddp.torchfree import TrainConfig
from lab.args import check_finite, check_job, check_warmup
from lab.engine.layout import Layout
from lab.engine.specs import DEFAULT_IMAGE
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
    "Planned",
    "job_name",
]

# The default workload is chosen so that both bucketing and overlap pay with real CPU compute
# (docs/experiments/latency.md, "Why this default"). Overlap hides an allreduce only behind
# the backward that runs after its bucket filled, and never the last bucket's, so backward
# must last about as long as the communication, and the communication must be bandwidth-bound
# and serial (a rate cap), or the no-overlap side merges everything into one latency-bound
# allreduce and loses nothing.
# Two nodes: on a 2-core host each rank then has a core, and communication is not starved
# during backward (with four ranks it is). Measured here, quiet host: the tower's backward at a
# global batch of 2048 takes ~370-430 ms, its 1.1 MB of gradients ~410-480 ms of allreduce at
# 20 Mbit/s; per-parameter, 82 latency-bound allreduces take over a second.
DEFAULT_NODES = 2
DEFAULT_RATE_MBIT = 20.0
# 0: one allreduce per tensor (82: the bucketing lesson); 0.15: five convolutions a bucket (7:
# the first fills after 1/6 of backward, the last holds the small first layers); 25: torch's
# default cap, one bucket here, which overlap cannot help.
DEFAULT_CAPS = (0.0, 0.15, 25.0)  # MB
# --quick: one round of fewer steps, per-parameter vs the overlap cap only.
QUICK = {"steps": 5, "rounds": 1, "caps": (0.0, 0.15)}
# The collective timeout is well below the run timeout, so a rank that lost a peer says so
# (its diagnosis) before lab stops the configuration.
TRAIN_DEFAULTS = TrainConfig(model="tower", steps=6, batch_size=2048, seed=0,
                             collective_timeout_s=60.0)  # fmt: skip


@dataclass(frozen=True)
class Configuration:
    """One configuration of the sweep: a bucket cap and overlap, or (cap None) the floor."""

    cap_mb: float | None
    overlap: bool | None = None

    @property
    def is_floor(self) -> bool:
        return self.cap_mb is None

    @property
    def name(self) -> str:
        """File-safe: part of the configuration's job name (its directory in the run)."""
        if self.cap_mb is None:
            return "nosync"
        return f"cap{self.cap_mb:g}-{'overlap' if self.overlap else 'nooverlap'}"

    @property
    def label(self) -> str:
        if self.cap_mb is None:
            return "no sync (floor)"
        what = "per-parameter" if self.cap_mb == 0 else f"cap {self.cap_mb:g} MB"
        return f"{what}, overlap {'on' if self.overlap else 'off'}"

    def train_config(self, base: TrainConfig) -> TrainConfig:
        """``base`` with this configuration's fields. The floor keeps the simulated backward
        compute too, so exposed communication stays step time minus floor."""
        if self.cap_mb is None:
            return base.replace(sync="none")
        return base.replace(bucket_cap_mb=self.cap_mb, overlap=bool(self.overlap))


def job_name(conf: Configuration, ms: float, round_: int) -> str:
    """The job of one run of a configuration: ``runs/<run-id>/<job>/``."""
    return f"{ms:g}ms-{conf.name}-r{round_}"


@dataclass(frozen=True)
class Planned:
    """One job of the sweep, in run order."""

    ms: float
    round: int
    conf: Configuration
    job: str
    train: TrainConfig


@dataclass(frozen=True)
class LatencyPlan:
    """What ``python -m lab latency`` measures, and its bounds."""

    ms: tuple[float, ...] = (5.0,)  # one-way delay per packet
    shaper: str = "auto"
    rate_mbit: float | None = DEFAULT_RATE_MBIT  # None: no rate cap
    caps: tuple[float, ...] = DEFAULT_CAPS
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
            check_finite("--caps", cap, 0.0)
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
                f"{','.join(f'{c:g}' for c in self.caps)}"
            )
        if self.cpus is not None and not (math.isfinite(self.cpus) and self.cpus > 0):
            raise ValueError(
                f"--cpus must be a finite number > 0 (cores per node), got {self.cpus!r}"
            )
        check_job(self.train, self.run_timeout_s, self.nodes, "configuration")

    @property
    def layout(self) -> Layout:
        return Layout(self.nodes, 1)

    def configurations(self) -> list[Configuration]:
        """At each delay, in order: the floor, then per cap overlap on and off (adjacent, so
        slow drift of the shared host's load hits both alike)."""
        confs = [Configuration(None)]
        for cap in self.caps:
            confs += [Configuration(cap, True), Configuration(cap, False)]
        return confs

    def jobs(self, ms: float) -> list[Planned]:
        """The jobs at one delay: every round runs every configuration."""
        return [
            Planned(ms, r, conf, job_name(conf, ms, r), conf.train_config(self.train))
            for r in range(1, self.rounds + 1)
            for conf in self.configurations()
        ]

    @property
    def total(self) -> int:
        return len(self.ms) * self.rounds * len(self.configurations())
