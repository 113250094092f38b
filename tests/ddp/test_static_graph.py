"""static_graph=True: reentrant activation checkpointing (a gradient arriving twice per
backward) and parameters unused from the start, against torch DDP with static_graph=True."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.utils.checkpoint import checkpoint

from ddp import DistributedDataParallel
from tests.ddp.common import Branches, batches, case_tests, seeded, torch_pair, train_both

ATOL = 1e-6
STEPS = 5


class _CheckpointTwice(nn.Module):
    """``layer`` runs in two reentrant checkpoints, so its gradient is accumulated twice per
    backward; ``head`` is checkpointed too, so the first gradients arrive inside an inner
    backward, whose end is not the end of backward."""

    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(24, 24)
        self.layer = nn.Linear(24, 24)
        self.head = nn.Linear(24, 4)

    def forward(self, x):
        h = torch.tanh(self.pre(x))
        h = checkpoint(self.layer, h, use_reentrant=True)
        h = checkpoint(self.layer, torch.tanh(h), use_reentrant=True)
        return checkpoint(self.head, torch.tanh(h), use_reentrant=True)


def _vs_torch(cls, hook=None, set_later: bool = False, **kw):
    def case(rank: int, world: int) -> None:
        assert not (set_later and hook), "a hook would be registered before _set_static_graph"
        later = {"static_graph": not set_later}
        ours, theirs = torch_pair(cls, hook, ours=later, static_graph=True, **kw)
        if set_later:
            ours._set_static_graph()
        train_both(ours, theirs, rank, STEPS, ATOL)
        assert ours._get_ddp_logging_data()["static_graph"] == 1

    return case


def _twice_without_static_graph_raises(rank: int, world: int) -> None:
    model = DistributedDataParallel(seeded(_CheckpointTwice))
    x, y = batches(rank, 1)[0]
    with pytest.raises(RuntimeError, match=r"received a gradient twice.*static_graph=True"):
        F.cross_entropy(model(x), y).backward()


class _LateBranch(nn.Module):
    """``b`` joins the graph from the second iteration on: not a static graph."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(24, 4)
        self.b = nn.Linear(24, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.a(x) + (self.b(x) if self.calls > 1 else 0)


def _changed_graph_raises(rank: int, world: int) -> None:
    model = DistributedDataParallel(seeded(_LateBranch), static_graph=True)
    (x, y), (x2, y2) = batches(rank, 2)
    F.cross_entropy(model(x), y).backward()
    with pytest.raises(RuntimeError, match="the graph changed"):
        F.cross_entropy(model(x2), y2).backward()


def _set_after_training_raises(rank: int, world: int) -> None:
    model = DistributedDataParallel(seeded(Branches), find_unused_parameters=True)
    x, y = batches(rank, 1)[0]
    F.cross_entropy(model(x), y).backward()
    with pytest.raises(RuntimeError, match="should be called before training loop starts"):
        model._set_static_graph()
    with pytest.warns(UserWarning, match="no need to set it again"):
        DistributedDataParallel(seeded(Branches), static_graph=True)._set_static_graph()
    dist.barrier()


CASES = {
    "checkpoint_twice": _vs_torch(_CheckpointTwice),
    "checkpoint_twice_set_later": _vs_torch(_CheckpointTwice, set_later=True),
    "checkpoint_small_buckets": _vs_torch(_CheckpointTwice, bucket_cap_mb=0.002),
    "checkpoint_allreduce_hook": _vs_torch(_CheckpointTwice, hook=default_hooks.allreduce_hook),
    "checkpoint_bucket_view": _vs_torch(_CheckpointTwice, gradient_as_bucket_view=True),
    "unused_from_start": _vs_torch(Branches),
    "unused_from_start_fp16": _vs_torch(Branches, hook=default_hooks.fp16_compress_hook),
    "twice_without_static_graph": _twice_without_static_graph_raises,
    "changed_graph": _changed_graph_raises,
    "set_after_training": _set_after_training_raises,
}


results, test_case_on_every_rank = case_tests(__name__, CASES)
