"""``lab memory``'s plan: the one job it runs three ways (our DDP with Adam, ours with the
optimizer state sharded, torch's DDP with torch's ``ZeroRedundancyOptimizer``), then twice more
under a container memory limit, validated before any container exists. Pure: tested without
Docker.

Every job runs in a fresh set of containers, one rank each: a container's memory high-water
mark (what the engine reports, and what a limit is held against) then belongs to that job
alone, and the page cache an earlier job brought in is not charged to the next.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddp.torchfree import TrainConfig
from lab.args import check_job, check_warmup
from lab.engine.layout import Layout
from lab.engine.specs import DEFAULT_IMAGE

__all__ = [
    "CONFIGS",
    "DDP",
    "LIMITED",
    "QUICK_STEPS",
    "SHARDED",
    "TORCH_ZERO",
    "TRAIN_DEFAULTS",
    "Config",
    "MemoryPlan",
]

QUICK_STEPS = 4
# The wide MLP (25.2M parameters, 101 MB): Adam's two moments are 202 MB per rank, large
# against torch's own few hundred MB, so what sharding saves shows in the process's memory.
# Adam's usual rate: SGD's 0.05 would throw the wide model's loss about.
TRAIN_DEFAULTS = TrainConfig(
    model="wide", steps=8, batch_size=64, lr=0.001, seed=0, collective_timeout_s=120.0
)


@dataclass(frozen=True)
class Config:
    """One way of running the job: its name (the job's directory), what the table calls it,
    and the ``TrainConfig`` fields it sets.

    The measured jobs run without the single-process reference: it starts every step from the
    whole optimizer state, gathered from the shards on rank 0 (torch's
    ``consolidate_state_dict`` even sends every shard to every rank: rank 1 peaked at 1789 MiB
    against DDP's 877 on 2 ranks), and it trains the global batch on rank 0 between steps,
    load the other jobs would not carry alike. That is memory, bytes and time of the check,
    not of the training; the measured jobs' parity is the replicas' bitwise identity after
    every step. The limited jobs run with the reference (:meth:`limited`): the sharded run
    that fits is judged against the single process, every step.
    """

    name: str
    label: str
    fields: tuple[tuple[str, Any], ...]

    def train(self, base: TrainConfig) -> TrainConfig:
        """The measured job's configuration."""
        return base.replace(**dict(self.fields), reference=False)

    def limited(self, base: TrainConfig) -> TrainConfig:
        """The job under the memory limit: the same, with the reference."""
        return base.replace(**dict(self.fields), reference=True)


DDP = Config("ddp-adam", "DDP + Adam", (("optimizer", "adam"),))
SHARDED = Config("sharded", "sharded (ours)", (("optimizer", "adam"), ("shard_optimizer", True)))
TORCH_ZERO = Config(
    "torch-zero",
    "torch DDP + ZeRO",
    (("optimizer", "adam"), ("shard_optimizer", True), ("wrapper", "torch")),
)
CONFIGS = (DDP, SHARDED, TORCH_ZERO)
# Under the memory limit: DDP with Adam (to be killed) and the sharded run (to fit).
LIMITED = {DDP.name: f"{DDP.name}-limited", SHARDED.name: f"{SHARDED.name}-limited"}


@dataclass(frozen=True)
class MemoryPlan:
    """What ``python -m lab memory`` runs, and its bounds."""

    nodes: int = 4
    warmup: int = 1
    train: TrainConfig = field(default_factory=lambda: TRAIN_DEFAULTS)
    limit: bool = True  # run the memory-limit jobs after the measured ones
    limit_mib: float | None = None  # the same limit on every node instead of the chosen ones
    run_timeout_s: float = 300.0  # wall time of one job
    image: str = DEFAULT_IMAGE
    runs_dir: Path = Path("runs")
    progress: bool = True

    def __post_init__(self) -> None:
        if self.nodes < 2:
            raise ValueError(f"--nodes must be >= 2 (sharding needs peers), got {self.nodes}")
        if self.limit_mib is not None:
            if not (math.isfinite(self.limit_mib) and self.limit_mib > 0):
                raise ValueError(f"--limit-mb must be a finite number > 0, got {self.limit_mib!r}")
            if not self.limit:
                raise ValueError("--limit-mb sets the limit of the runs --no-limit skips: drop one")
        check_warmup(self.warmup, self.train.steps)
        check_job(self.train, self.run_timeout_s, self.nodes, "job")
        for conf in CONFIGS:
            try:
                conf.train(self.train)
            except ValueError as e:
                raise ValueError(f"{conf.label}: {e}") from None

    @property
    def layout(self) -> Layout:
        return Layout(self.nodes, 1)

    @property
    def jobs(self) -> list[str]:
        """Every job, in run order."""
        return [c.name for c in CONFIGS] + (list(LIMITED.values()) if self.limit else [])

    def describe(self) -> str:
        t = self.train
        return (
            f"{self.nodes} nodes (one rank each), model {t.model}, Adam (lr {t.lr:g}), "
            f"{t.steps} steps, global batch {t.batch_size}"
        )
