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
from ddp.wrapper.distributed import DistributedDataParallel
from ddp.wrapper.zero import ShardedOptimizer

__all__ = ["build_optimizer", "full_state_dict", "optimizer_class", "optimizer_kwargs", "shard"]


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
    (``shard``)."""
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
    if isinstance(opt, ShardedOptimizer):  # ours: the same contract as torch's
        opt.consolidate_state_dict(to=0)
        return opt.state_dict() if dist.get_rank() == 0 else None
    return opt.state_dict()


def shard(model: DistributedDataParallel, cfg: TrainConfig, plain: torch.optim.Optimizer) -> Any:
    """``--shard-optimizer`` on our wrapper: a ``ShardedOptimizer`` of the same class and
    settings, holding this rank's shard of ``plain``'s state (empty, or a checkpoint's)."""
    sharded = ShardedOptimizer(model, optimizer_class(cfg), **optimizer_kwargs(cfg))
    state = plain.state_dict()
    state["param_groups"][0] = {**state["param_groups"][0], **plain.param_groups[0]}
    state["param_groups"][0]["params"] = list(range(len(plain.param_groups[0]["params"])))
    sharded.load_state_dict(state)
    return sharded
