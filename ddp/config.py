"""Run configuration, and the one place that reads the rendezvous environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ddp.models import MODELS

__all__ = ["Rendezvous", "TrainConfig"]

# allreduce: DDP. barrier: dist.barrier() instead of allreduce (replicas drift: the demo of
# why). none: no communication at all, the floor that "exposed communication" is measured from.
SYNC_MODES = ("allreduce", "barrier", "none")


@dataclass
class TrainConfig:
    """Everything that decides what one training run computes (and how it is reported)."""

    model: str = "mini"
    steps: int = 20
    batch_size: int = 64  # global: split evenly across ranks
    lr: float = 0.05
    momentum: float = 0.9
    seed: int = 0
    bucket_cap_mb: float = 25.0
    overlap: bool = True
    sync: str = "allreduce"
    log_dir: str | None = None
    timeout_s: float = 300.0  # collective timeout handed to the process group
    tolerance: float = 1e-5  # max |param diff| vs the single-process reference
    reference: bool = True  # rank 0 also trains the single-process reference
    checkpoint_every: int = 0  # rank 0 checkpoints every K steps (0: never)
    checkpoint_dir: str | None = None  # default: <log_dir>/checkpoints
    resume: bool = False  # start from the newest complete checkpoint
    step_delay_ms: float = 0.0  # sleep per step: a stand-in for compute, to watch faults
    backward_delay_ms: float = 0.0  # sleep spread over backward: simulated accelerator compute

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {sorted(MODELS)}, got {self.model!r}")
        if self.sync not in SYNC_MODES:
            raise ValueError(f"sync must be one of {SYNC_MODES}, got {self.sync!r}")
        for name in ("steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.bucket_cap_mb >= 0:
            raise ValueError(f"bucket_cap_mb must be >= 0, got {self.bucket_cap_mb}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        for name in ("step_delay_ms", "backward_delay_ms"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0, got {self.checkpoint_every}")
        if (self.checkpoint_every or self.resume) and self.checkpoints is None:
            raise ValueError(
                "checkpointing and resume need a directory all ranks can read: pass "
                "--checkpoint-dir DIR (or --log-dir DIR, which implies DIR/checkpoints)"
            )
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {self.timeout_s}")

    @property
    def checkpoints(self) -> Path | None:
        if self.checkpoint_dir:
            return Path(self.checkpoint_dir)
        return Path(self.log_dir) / "checkpoints" if self.log_dir else None

    def local_batch(self, world_size: int) -> int:
        """Per-rank batch. Equal shards are what make the mean of per-rank mean losses equal
        the global-batch mean loss, i.e. what makes parity exact."""
        if self.batch_size % world_size:
            raise ValueError(
                f"batch_size {self.batch_size} is not divisible by world size {world_size}; "
                f"pick a multiple of {world_size}"
            )
        return self.batch_size // world_size

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Rendezvous:
    """How this process finds its peers: its rank, the world size and an init_method URL."""

    rank: int
    world_size: int
    init_method: str

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {self.rank}")
        if not self.init_method.startswith(("file://", "env://", "tcp://")):
            raise ValueError(
                f"init_method must be a file://, tcp:// or env:// URL, got {self.init_method!r}"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Rendezvous:
        """Read torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): env://."""
        env = os.environ if env is None else env
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in env]
        if missing:
            raise ValueError(
                f"no rendezvous given: pass --rank, --world-size and --init-method, or launch "
                f"under torchrun (missing environment variables: {', '.join(missing)})"
            )
        return cls(rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]), init_method="env://")
