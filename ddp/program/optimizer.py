"""The optimizer of a run: which class (``--optimizer``), whether its state is sharded over the
ranks (``--shard-optimizer``), and its whole state as one ``state_dict`` whatever the sharding.

The single-process reference, a checkpoint and a resumed run all see one plain optimizer's
``state_dict`` (keyed per parameter, as ``torch.optim.SGD`` / ``Adam`` write it), so a sharded
run's checkpoint loads into an unsharded run and the other way round, at any world size.
Gathering that whole state from a sharded optimizer is a collective: every rank calls
:func:`full_state_dict`, rank 0 gets it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer

from ddp.program.config import TrainConfig

__all__ = ["build_optimizer", "full_state_dict", "optimizer_class", "optimizer_kwargs"]


def optimizer_class(cfg: TrainConfig) -> type[torch.optim.Optimizer]:
    return {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}[cfg.optimizer]


def optimizer_kwargs(cfg: TrainConfig) -> dict[str, Any]:
    """The settings ``TrainConfig`` gives the optimizer: Adam takes torch's defaults but lr."""
    if cfg.optimizer == "sgd":
        return {"lr": cfg.lr, "momentum": cfg.momentum}
    return {"lr": cfg.lr}


def build_optimizer(
    params: Iterable[torch.nn.Parameter] | nn.Module, cfg: TrainConfig, *, sharded: bool = False
) -> torch.optim.Optimizer:
    """The plain optimizer over ``params`` (a module: its parameters), or with ``sharded`` and
    ``--wrapper torch`` torch's ``ZeroRedundancyOptimizer`` wrapping the same class (needs the
    process group). Our own sharding is built on the wrapper's buckets, after wrapping
    (``ddp.wrapper.zero``)."""
    if isinstance(params, nn.Module):
        params = params.parameters()
    if sharded and cfg.shard_optimizer and cfg.wrapper == "torch":
        return ZeroRedundancyOptimizer(
            params, optimizer_class=optimizer_class(cfg), **optimizer_kwargs(cfg)
        )
    return optimizer_class(cfg)(params, **optimizer_kwargs(cfg))


def full_state_dict(opt: torch.optim.Optimizer) -> dict[str, Any] | None:
    """The whole optimizer state as a plain optimizer's ``state_dict``, on rank 0 (None on
    the others when ``opt`` is sharded). A collective for a sharded optimizer: every rank
    calls it, at the same point."""
    if isinstance(opt, ZeroRedundancyOptimizer):
        opt.consolidate_state_dict(to=0)
        return opt.state_dict() if dist.get_rank() == 0 else None
    gather = getattr(opt, "full_state_dict", None)
    if gather is not None:  # ours (ddp.wrapper.zero.ShardedOptimizer)
        return gather(to=0)
    return opt.state_dict()
