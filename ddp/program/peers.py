"""How a process finds its peers: its rank, the world size and an init_method URL, from flags
or from torchrun's environment. Torch-free, like the configuration that re-exports it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Rendezvous"]


@dataclass(frozen=True)
class Rendezvous:
    """How this process finds its peers: its rank, the world size and an init_method URL."""

    rank: int
    world_size: int
    init_method: str

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"--world-size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"--rank must be in 0..{self.world_size - 1}, got {self.rank}")
        if not self.init_method.startswith(("file://", "env://", "tcp://")):
            raise ValueError(
                f"--init-method must be a file://, tcp:// or env:// URL, got {self.init_method!r}"
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

    def to_argv(self) -> list[str]:
        """The flags of ``python -m ddp train`` that give this rendezvous."""
        return [
            "--rank",
            str(self.rank),
            "--world-size",
            str(self.world_size),
            "--init-method",
            self.init_method,
        ]
