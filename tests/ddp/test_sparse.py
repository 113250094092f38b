"""Sparse gradients (``nn.Embedding(..., sparse=True)``) against torch DDP on gloo: plain
training with a different nnz per rank, find_unused_parameters with a rank that skips the
embedding, no_sync() accumulation, and a communication hook."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from ddp import DistributedDataParallel
from tests.ddp.common import assert_same_params, run_cases, seeded, verdicts
from tests.helpers import run_ranks

ATOL = 1e-6
STEPS = 4


class EmbedHead(nn.Module):
    """A sparse embedding bag-of-indices into a dense head; ``idx=None`` skips the embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 8, sparse=True)
        self.head = nn.Linear(8, 4)

    def forward(self, idx: torch.Tensor | None) -> torch.Tensor:
        h = torch.ones(1, 8) if idx is None else self.emb(idx).mean(0, keepdim=True)
        return self.head(h)


def _indices(rank: int, step: int) -> torch.Tensor:
    """Different rows and a different count per rank, with repeats (an uncoalesced gradient)."""
    g = torch.Generator().manual_seed(100 * rank + step)
    idx = torch.randint(0, 100, (2 + 3 * rank,), generator=g)
    return torch.cat([idx, idx[:1]])


def _pair(**kwargs) -> tuple[nn.Module, nn.Module, nn.Module, nn.Module]:
    ours, theirs = seeded(EmbedHead), seeded(EmbedHead)
    return (
        ours,
        DistributedDataParallel(ours, **kwargs),
        theirs,
        nn.parallel.DistributedDataParallel(theirs, **kwargs),
    )


def _assert_same_grads(ours: nn.Module, theirs: nn.Module, what: str) -> None:
    g, h = ours.emb.weight.grad, theirs.emb.weight.grad
    assert g is not None and g.is_sparse and h.is_sparse, what
    assert g.is_coalesced() == h.is_coalesced(), what
    torch.testing.assert_close(g.to_dense(), h.to_dense(), atol=ATOL, rtol=0, msg=what)
    torch.testing.assert_close(ours.head.weight.grad, theirs.head.weight.grad, atol=ATOL, rtol=0)


def _train(
    rank: int,
    world: int,
    *,
    skip: Callable[[int], bool] = lambda step: False,
    micro: int = 1,
    hook: bool = False,
    **kwargs,
) -> None:
    """STEPS SGD steps on our wrapper and on torch's; ``skip(step)``: this rank's forward
    leaves the embedding out; ``micro``: micro-batches per step, all but the last in no_sync.
    torch needs a defined sparse .grad on a rank that skips it, hence zero_grad to zeros
    there; ours is also fine with None, which is what it gets."""
    ours, ddp, theirs, ref = _pair(**kwargs)
    if hook:
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        ref.register_comm_hook(None, default_hooks.allreduce_hook)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ours, theirs)]
    for step in range(STEPS):
        opts[0].zero_grad(set_to_none=True)
        opts[1].zero_grad(set_to_none=False)
        for model in (ddp, ref):
            for k in range(micro):
                idx = None if skip(step) else _indices(rank, micro * step + k)
                if k < micro - 1:
                    with model.no_sync():
                        torch.tanh(model(idx)).sum().backward()
                else:
                    torch.tanh(model(idx)).sum().backward()
        _assert_same_grads(ours, theirs, f"rank {rank} step {step}")
        for opt in opts:
            opt.step()
        assert_same_params(ours, theirs, ATOL, f"rank {rank} step {step}")


def _plain(rank: int, world: int) -> None:
    _train(rank, world)


def _unused(rank: int, world: int) -> None:
    # torch refuses a rank whose sparse .grad is None: its first step has every rank use it
    _train(rank, world, skip=lambda step: rank == 1 and step % 2 == 1, find_unused_parameters=True)


def _accumulate(rank: int, world: int) -> None:
    _train(rank, world, micro=3)


def _hook(rank: int, world: int) -> None:
    _train(rank, world, hook=True)


def _embedding_only(rank: int, world: int) -> None:
    # No dense bucket at all: the end-of-backward callback comes from the outputs' hook.
    ours, theirs = seeded(nn.Embedding, 100, 8), seeded(nn.Embedding, 100, 8)
    ours.sparse = theirs.sparse = True
    ddp, ref = DistributedDataParallel(ours), nn.parallel.DistributedDataParallel(theirs)
    for step in range(2):
        for model in (ddp, ref):
            torch.tanh(model(_indices(rank, step))).sum().backward()
        g, h = ours.weight.grad, theirs.weight.grad
        assert g.is_sparse and g.is_coalesced() == h.is_coalesced()
        torch.testing.assert_close(g.to_dense(), h.to_dense(), atol=ATOL, rtol=0)


CASES = {
    "plain": _plain,
    "unused": _unused,
    "accumulate": _accumulate,
    "hook": _hook,
    "embedding_only": _embedding_only,
}


@pytest.fixture(scope="module", params=[2, 3])
def results(request, tmp_path_factory):
    world = request.param
    tmp = tmp_path_factory.mktemp(f"sparse{world}")
    return run_ranks(run_cases, world, tmp, __name__, list(CASES), timeout_s=240)


@pytest.mark.parametrize("case", list(CASES))
def test_sparse_matches_torch(results, case):
    verdicts(results, case)
