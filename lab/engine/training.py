"""The one place that builds ddp's command line for a rank: from a ``TrainConfig``.

A training job gives every rank the same configuration plus that rank's overrides (e.g. a
slower rank), the rendezvous of the job (a fresh ``file://`` store in the job's directory on
the shared volume: a stale one fails ``connectFullMesh``) and the job's log directory, and asks
ddp to mirror its records on stdout, which is how the lab follows the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddp.config import Rendezvous, TrainConfig
from lab.engine.layout import Layout
from lab.engine.specs import job_dir

__all__ = ["rank_configs", "train_argv", "train_argvs"]


def train_argv(cfg: TrainConfig, rdzv: Rendezvous) -> list[str]:
    """``python -m ddp train`` for one rank."""
    return ["python", "-m", "ddp", "train", *rdzv.to_argv(), *cfg.to_argv()]


def rank_configs(
    job: str,
    layout: Layout,
    cfg: TrainConfig,
    overrides: Mapping[int, Mapping[str, Any]] | None = None,
) -> dict[int, TrainConfig]:
    """Every rank's validated config: ``cfg``, the job's log directory, records on stdout,
    then the rank's ``overrides``."""
    overrides = overrides or {}
    bad = sorted(set(overrides) - set(range(layout.world_size)))
    if bad:
        raise ValueError(f"overrides for ranks {bad}, but the ranks are 0..{layout.world_size - 1}")
    cfg.local_batch(layout.world_size)  # the global batch must split over these ranks
    base = cfg.replace(log_dir=f"{job_dir(job)}/logs", emit_records=True)
    return {r: base.replace(**overrides.get(r, {})) for r in range(layout.world_size)}


def train_argvs(
    job: str,
    layout: Layout,
    cfg: TrainConfig,
    overrides: Mapping[int, Mapping[str, Any]] | None = None,
) -> dict[int, list[str]]:
    """Rank -> argv of a training job on ``layout``."""
    init = f"file://{job_dir(job)}/rendezvous"
    return {
        rank: train_argv(rank_cfg, Rendezvous(rank, layout.world_size, init))
        for rank, rank_cfg in rank_configs(job, layout, cfg, overrides).items()
    }
