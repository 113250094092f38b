"""``lab straggler``'s plan: which rank is slowed, by how much CPU, and the training both jobs
run (an unslowed baseline, then the same job with the straggler), validated before any
container exists. Pure: tested without Docker.

The slowdown is a real CPU quota on the straggler's container (cgroup CFS bandwidth), not a
sleep. ``--slowdown X`` asks for X times less CPU than the rank's fair share of the host
(host cores / nodes): four ranks on a 2-core host get 0.5 core each, so ``--slowdown 4`` is a
quota of 0.125 cores. A quota at or above the fair share slows nothing, which is why it is
derived from the share and not given as a bare number (``--cpus`` overrides it, for
measuring what quota gives what slowdown). The slowdown the ranks really see is measured, and
reported beside the one asked.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from ddp.torchfree import TrainConfig
from lab.args import check_job, check_warmup
from lab.engine.layout import Layout
from lab.engine.specs import DEFAULT_IMAGE
from lab.shaping.impair import Impairments

__all__ = [
    "BASELINE_JOB",
    "CPU_PERIOD_US",
    "QUICK_STEPS",
    "SLOWED_JOB",
    "TRAIN_DEFAULTS",
    "StragglerPlan",
    "fair_share",
]

BASELINE_JOB, SLOWED_JOB = "baseline", "straggler"
QUICK_STEPS = 8
# The deep MLP (12 x 256 hidden) at 256 samples per rank: forward+backward is tens of ms of
# real CPU work per step, large against one allreduce on the bridge, so a slowed rank shows.
TRAIN_DEFAULTS = TrainConfig(
    model="deep", steps=30, batch_size=1024, seed=0, collective_timeout_s=60.0
)
# The quota's CFS period: the kernel lets the container run `quota` cores x period, then
# throttles it until the period ends. With docker's 100 ms a step of a few tens of ms runs at
# full speed or stalls whole; 10 ms spreads the slowdown over every step.
CPU_PERIOD_US = 10_000
_MIN_CPUS = 0.01  # the kernel's smallest CFS quota is 1 ms per period; 1% of a core is safer


def fair_share(host_cpus: int, nodes: int) -> float:
    """Cores per node when every node's ranks are busy: what an unslowed rank gets."""
    return host_cpus / nodes


@dataclass(frozen=True)
class StragglerPlan:
    """What ``python -m lab straggler`` runs, and its bounds."""

    rank: int = 1
    slowdown: float = 4.0  # asked: X times less CPU than the fair share
    cpus: float | None = None  # explicit quota in cores (overrides --slowdown)
    slow_link_ms: float = 0.0  # extra one-way delay on the straggler's node only
    shaper: str = "auto"
    nodes: int = 4
    warmup: int = 2
    train: TrainConfig = field(default_factory=lambda: TRAIN_DEFAULTS)
    run_timeout_s: float = 300.0  # wall time of one job
    host_cpus: int = field(default_factory=lambda: os.cpu_count() or 1)
    image: str = DEFAULT_IMAGE
    runs_dir: Path = Path("runs")
    progress: bool = True
    impair: Impairments = field(default_factory=Impairments)  # with the slow link only

    def __post_init__(self) -> None:
        if self.impair and not self.slow_link_ms:
            raise ValueError(
                "--jitter-ms and --loss-pct impair the slowed job's link: give --slow-link-ms "
                "too (e.g. --slow-link-ms 10), or use `lab latency` for impairments alone"
            )
        if self.nodes < 2:
            raise ValueError(f"--nodes must be >= 2 (a straggler needs peers), got {self.nodes}")
        if not 0 <= self.rank < self.nodes:
            raise ValueError(
                f"--rank must be in 0..{self.nodes - 1} (one rank per node), got {self.rank}"
            )
        if not (math.isfinite(self.slowdown) and self.slowdown >= 1):
            raise ValueError(
                f"--slowdown must be a finite number >= 1 (1 = no quota), got {self.slowdown!r}"
            )
        if self.cpus is not None and not (
            math.isfinite(self.cpus) and _MIN_CPUS <= self.cpus <= self.host_cpus
        ):
            raise ValueError(
                f"--cpus must be between {_MIN_CPUS:g} and the host's {self.host_cpus} cores, "
                f"got {self.cpus!r}"
            )
        if not (math.isfinite(self.slow_link_ms) and self.slow_link_ms >= 0):
            raise ValueError(
                f"--slow-link-ms must be a finite number >= 0, got {self.slow_link_ms!r}"
            )
        if self.quota is None and not self.slow_link_ms:
            raise ValueError(
                "nothing slows the straggler: give --slowdown above 1, --cpus, or --slow-link-ms"
            )
        check_warmup(self.warmup, self.train.steps)
        check_job(self.train, self.run_timeout_s, self.nodes, "job")

    @property
    def layout(self) -> Layout:
        return Layout(self.nodes, 1)

    @property
    def node(self) -> int:
        """The straggler's container (one rank per node)."""
        return self.layout.node_of(self.rank)

    @property
    def share(self) -> float:
        return fair_share(self.host_cpus, self.nodes)

    @property
    def quota(self) -> float | None:
        """The straggler's CPU quota in cores, None when only its link is slowed."""
        if self.cpus is not None:
            return self.cpus
        if self.slowdown == 1:
            return None
        return max(_MIN_CPUS, self.share / self.slowdown)

    def describe(self) -> str:
        """What slows the straggler, in one phrase."""
        parts = []
        if self.quota is not None:
            asked = "--cpus" if self.cpus is not None else f"--slowdown {self.slowdown:g}"
            parts.append(
                f"a CPU quota of {self.quota:.3g} cores ({asked}; fair share "
                f"{self.share:.3g} = {self.host_cpus} cores / {self.nodes} nodes)"
            )
        if self.slow_link_ms:
            impair = f" (every link: {self.impair.describe()})" if self.impair else ""
            parts.append(f"{self.slow_link_ms:g} ms extra one-way delay on its link{impair}")
        return f"rank {self.rank} (node{self.node}) slowed by " + " and ".join(parts)
