"""Topologies: how many nodes, how many ranks on each, and what they train.

A topology is a small YAML file (see ``lab/topologies/``) parsed into frozen dataclasses that
validate themselves, so a bad file fails before any container exists. Command-line flags of
``python -m lab up`` override the file's training settings via :meth:`Topology.with_overrides`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = ["MODELS", "SYNC_MODES", "Topology", "TrainSettings", "load_topology"]

MODELS = ("mini", "deep", "branchy")
SYNC_MODES = ("allreduce", "barrier")


def _check_int(name: str, value: Any, minimum: int) -> None:
    # bool is an int subclass; `nodes: yes` in YAML must not become 1 node.
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class TrainSettings:
    """Flags passed to every ``python -m ddp train`` rank (same names, same defaults)."""

    steps: int = 20
    batch_size: int = 64
    bucket_cap_mb: float = 25.0
    overlap: bool = True
    model: str = "mini"
    seed: int = 0
    lr: float | None = None  # None: ddp's own default
    collective_timeout_s: float | None = None  # None: ddp's own default (its --timeout)
    sync: str = "allreduce"  # "barrier" skips the gradient allreduce: replicas drift, parity broken

    def __post_init__(self) -> None:
        _check_int("steps", self.steps, 1)
        _check_int("batch_size", self.batch_size, 1)
        _check_int("seed", self.seed, 0)
        if isinstance(self.bucket_cap_mb, bool) or not isinstance(self.bucket_cap_mb, int | float):
            raise ValueError(f"bucket_cap_mb must be a number, got {self.bucket_cap_mb!r}")
        if not math.isfinite(self.bucket_cap_mb) or self.bucket_cap_mb < 0:
            raise ValueError(
                f"bucket_cap_mb must be >= 0 (0 = one allreduce per parameter), "
                f"got {self.bucket_cap_mb!r}"
            )
        if not isinstance(self.overlap, bool):
            raise ValueError(f"overlap must be true or false, got {self.overlap!r}")
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {', '.join(MODELS)}, got {self.model!r}")
        if self.lr is not None and not (isinstance(self.lr, int | float) and self.lr > 0):
            raise ValueError(f"lr must be a positive number, got {self.lr!r}")
        if self.sync not in SYNC_MODES:
            raise ValueError(f"sync must be one of {', '.join(SYNC_MODES)}, got {self.sync!r}")
        timeout = self.collective_timeout_s
        if timeout is not None and not (isinstance(timeout, int | float) and timeout > 0):
            raise ValueError(f"collective_timeout_s must be a positive number, got {timeout!r}")

    def ddp_flags(self) -> list[str]:
        """The training flags as ``python -m ddp train`` arguments."""
        flags = [
            "--steps", str(self.steps),
            "--batch-size", str(self.batch_size),
            "--bucket-cap-mb", f"{self.bucket_cap_mb:g}",
            "--seed", str(self.seed),
            "--model", self.model,
        ]  # fmt: skip
        if not self.overlap:
            flags.append("--no-overlap")
        if self.lr is not None:
            flags += ["--lr", f"{self.lr:g}"]
        if self.collective_timeout_s is not None:
            flags += ["--timeout", f"{self.collective_timeout_s:g}"]
        if self.sync != "allreduce":
            flags += ["--sync", self.sync]
        return flags


@dataclass(frozen=True)
class Topology:
    """``nodes`` containers with ``ranks_per_node`` ranks each; node i owns ranks i*k .. i*k+k-1."""

    nodes: int = 4
    ranks_per_node: int = 1
    train: TrainSettings = field(default_factory=TrainSettings)
    name: str = ""

    def __post_init__(self) -> None:
        _check_int("nodes", self.nodes, 1)
        _check_int("ranks_per_node", self.ranks_per_node, 1)
        if not isinstance(self.train, TrainSettings):
            raise ValueError(f"train must be TrainSettings, got {type(self.train).__name__}")
        if self.train.batch_size % self.world_size:
            raise ValueError(
                f"batch_size {self.train.batch_size} (global) must divide evenly over "
                f"{self.world_size} ranks; pick a multiple of {self.world_size}"
            )
        if not self.name:
            object.__setattr__(self, "name", f"{self.nodes}x{self.ranks_per_node}")

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    def ranks_of(self, node: int) -> list[int]:
        """Global ranks that run on ``node``."""
        if not 0 <= node < self.nodes:
            raise ValueError(f"node must be in 0..{self.nodes - 1}, got {node}")
        k = self.ranks_per_node
        return list(range(node * k, node * k + k))

    def node_of(self, rank: int) -> int:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in 0..{self.world_size - 1}, got {rank}")
        return rank // self.ranks_per_node

    def with_overrides(
        self, nodes: int | None = None, ranks_per_node: int | None = None, **train: Any
    ) -> Topology:
        """A copy with the given values replaced; ``None`` means keep (for optional CLI flags)."""
        train = {k: v for k, v in train.items() if v is not None}
        return Topology(
            nodes=self.nodes if nodes is None else nodes,
            ranks_per_node=self.ranks_per_node if ranks_per_node is None else ranks_per_node,
            train=dataclasses.replace(self.train, **train),
            name=self.name if nodes is None and ranks_per_node is None else "",
        )

    @classmethod
    def from_dict(cls, data: Any, source: str = "topology") -> Topology:
        """Build from parsed YAML, rejecting unknown keys so typos do not pass silently."""
        if not isinstance(data, dict):
            raise ValueError(
                f"{source}: expected a mapping at top level, got {type(data).__name__}"
            )
        _reject_unknown(data, {"name", "nodes", "ranks_per_node", "train"}, source)
        train = data.get("train") or {}
        if not isinstance(train, dict):
            raise ValueError(f"{source}: 'train' must be a mapping, got {type(train).__name__}")
        known = {f.name for f in dataclasses.fields(TrainSettings)}
        _reject_unknown(train, known, f"{source}: train")
        try:
            return cls(
                nodes=data.get("nodes", 4),
                ranks_per_node=data.get("ranks_per_node", 1),
                train=TrainSettings(**train),
                name=str(data.get("name") or ""),
            )
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None


def _reject_unknown(data: dict, known: set[str], where: str) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(
            f"{where}: unknown key(s) {', '.join(map(str, unknown))}; "
            f"known: {', '.join(sorted(known))}"
        )


def load_topology(path: str | Path) -> Topology:
    """Parse and validate a topology YAML file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ValueError(f"cannot read topology file {path}: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from None
    return Topology.from_dict(data, source=str(path))
