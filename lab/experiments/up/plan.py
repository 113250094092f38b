"""``lab up``'s plan: a layout, the training config and the run's bounds, validated.

Topology files (``topologies/*.yaml``) give ``name``, ``nodes``, ``ranks_per_node`` and a
``train`` mapping of ``TrainConfig`` fields; flags override the file. Pure: tested without
Docker, and a bad file fails before any container exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ddp.torchfree import TrainConfig
from lab.engine.layout import Layout
from lab.engine.specs import DEFAULT_IMAGE

__all__ = ["LAUNCHERS", "TOPOLOGIES", "Topology", "UpPlan", "load_topology"]

LAUNCHERS = ("file", "torchrun")

TOPOLOGIES = Path(__file__).resolve().parent / "topologies"
_KEYS = {"name", "nodes", "ranks_per_node", "train"}
# Set by lab for every rank (the job's directory, records on stdout): not a file's business.
_LAB_OWNS = {"log_dir", "emit_records", "checkpoint_dir"}


@dataclass(frozen=True)
class Topology:
    layout: Layout = field(default_factory=Layout)
    train: TrainConfig = field(default_factory=TrainConfig)
    name: str = ""

    @classmethod
    def from_dict(cls, data: Any, source: str = "topology") -> Topology:
        """Build from parsed YAML, rejecting unknown keys so typos do not pass silently."""
        if not isinstance(data, dict):
            raise ValueError(
                f"{source}: expected a mapping at top level, got {type(data).__name__}"
            )
        unknown = sorted(set(data) - _KEYS)
        if unknown:
            raise ValueError(
                f"{source}: unknown key(s) {', '.join(map(str, unknown))}; known: "
                f"{', '.join(sorted(_KEYS))}"
            )
        train = data.get("train") or {}
        if not isinstance(train, dict):
            raise ValueError(f"{source}: 'train' must be a mapping, got {type(train).__name__}")
        owned = sorted(set(train) & _LAB_OWNS)
        if owned:
            raise ValueError(f"{source}: train: {', '.join(owned)} are set by lab, not by files")
        try:
            layout = Layout(data.get("nodes", 4), data.get("ranks_per_node", 1))
            return cls(
                layout,
                TrainConfig.from_dict(train, f"{source}: train"),
                str(data.get("name") or ""),
            )
        except ValueError as e:
            raise ValueError(e if str(e).startswith(source) else f"{source}: {e}") from None


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


@dataclass(frozen=True)
class UpPlan:
    """One ``lab up`` run."""

    layout: Layout = field(default_factory=Layout)
    train: TrainConfig = field(default_factory=TrainConfig)
    name: str = ""
    image: str = DEFAULT_IMAGE
    run_timeout_s: float = 600.0
    runs_dir: Path = Path("runs")
    progress: bool = True
    launcher: str = "file"  # one of LAUNCHERS

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise ValueError(
                f"--launcher must be one of {', '.join(LAUNCHERS)}, got {self.launcher!r}"
            )
        self.train.local_batch(self.layout.world_size)  # the batch must split over the ranks
        if not self.run_timeout_s > 0:
            raise ValueError(f"--run-timeout must be > 0 seconds, got {self.run_timeout_s!r}")
        if not self.name:
            object.__setattr__(self, "name", self.layout.name)
