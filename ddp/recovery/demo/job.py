"""What one replica of a recovery run trains, whoever drives the recovery (ours or torchft).

The same data, model and optimizer as every other mode of ``python -m ddp`` (from the one
``TrainConfig``), and the global batch kept over any world (``ddp.recovery.demo.batches``), so
the two drivers train the very same job and their figures can stand side by side.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ddp.program.config import TrainConfig
from ddp.program.data import make_dataset
from ddp.program.models import build_model, simulate_backward_compute
from ddp.program.optimizer import build_optimizer
from ddp.program.records import RecordLog
from ddp.recovery.demo.batches import GlobalBatches

__all__ = ["ReplicaJob", "job_parts"]


@dataclass
class ReplicaJob:
    """The job's parts; each driver's state extends it (``LiveRun``, torchft's ``Replica``)."""

    cfg: TrainConfig
    replica: int  # its --rank
    jlog: RecordLog
    x: torch.Tensor
    y: torch.Tensor
    batches: GlobalBatches
    module: nn.Module
    opt: torch.optim.Optimizer
    started_t: float


def job_parts(cfg: TrainConfig, replica: int, jlog: RecordLog, started_t: float) -> dict:
    """The fields of ``ReplicaJob`` for this replica, built the same way on every replica."""
    torch.set_num_threads(1)
    x, y = make_dataset(cfg.seed)
    module = build_model(cfg.model, cfg.seed)
    if cfg.backward_delay_ms:
        simulate_backward_compute(module, cfg.backward_delay_ms)
    return {
        "cfg": cfg,
        "replica": replica,
        "jlog": jlog,
        "x": x,
        "y": y,
        "batches": GlobalBatches(len(x), cfg.batch_size, cfg.seed),
        "module": module,
        "opt": build_optimizer(module, cfg),
        "started_t": started_t,
    }
