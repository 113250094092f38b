"""Sharded optimizer state (``ddp.wrapper.zero.ShardedOptimizer``) on spawned gloo ranks, at 2
and 4 ranks: parity with one process on the global batch every step, bitwise identical
replicas, 1/N of the state, uneven buckets, no_sync, checkpoints that resume bitwise, the
refusals, and torch's ZeroRedundancyOptimizer on the same job."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer

from ddp import DistributedDataParallel, ShardedOptimizer
from tests.ddp.common import run_cases, verdicts
from tests.helpers import run_ranks

ATOL = 1e-6
LOCAL = 6
SGD = (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9})
ADAM = (torch.optim.Adam, {"lr": 0.01})


class Odd(nn.Module):
    """Parameter sizes that no world size divides (35, 7, 21, 3, 6, 2 elements)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(5, 7), nn.Linear(7, 3), nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return Odd()


def _batch(step: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(LOCAL * world, 5, generator=g), torch.randn(LOCAL * world, 2, generator=g)


def _mine(x: torch.Tensor, rank: int) -> torch.Tensor:
    return x[rank * LOCAL : (rank + 1) * LOCAL]


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(model(x), y)


def _sharded(cap_mb: float, optim, **kw):
    model = DistributedDataParallel(_model(), bucket_cap_mb=cap_mb, **kw)
    cls, settings = optim
    return model, ShardedOptimizer(model, cls, **settings)


def _step(model, opt, rank: int, world: int, step: int) -> None:
    x, y = _batch(step, world)
    opt.zero_grad()
    _loss(model, _mine(x, rank), _mine(y, rank)).backward()
    opt.step()


def _assert_replicas_identical(module: nn.Module, world: int, what: str) -> None:
    flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(everyone, flat)
    for r, other in enumerate(everyone):
        assert torch.equal(other, flat), f"{what}: rank {r}'s parameters differ bitwise"


def _state_elements(opt) -> int:
    inner = getattr(opt, "optim", opt)
    return sum(
        t.numel() for s in inner.state.values() for t in s.values() if isinstance(t, torch.Tensor)
    )


def _parity(optim, cap_mb: float):
    def case(rank: int, world: int) -> None:
        model, opt = _sharded(cap_mb, optim)
        assert model.num_buckets == (6 if cap_mb == 0 else 2)
        ref = _model()
        ref_opt = optim[0](ref.parameters(), **optim[1])
        for step in range(5):
            _step(model, opt, rank, world, step)
            x, y = _batch(step, world)
            ref_opt.zero_grad()
            _loss(ref, x, y).backward()
            ref_opt.step()
            for (name, p), q in zip(model.module.named_parameters(), ref.parameters(), strict=True):
                torch.testing.assert_close(p, q, atol=ATOL, rtol=0, msg=f"step {step} {name}")
            _assert_replicas_identical(model.module, world, f"step {step}")
        # the state is 1/N: each bucket's padded length over N, whatever the parameter sizes
        n = sum(-(-spec.numel // world) for spec in model.reducer.plan)
        steps = len(model.reducer.plan) if optim is ADAM else 0  # Adam's step, one per bucket
        assert _state_elements(opt) == (2 if optim is ADAM else 1) * n + steps
        # and the whole of it, gathered, is the single process's
        opt.consolidate_state_dict(to=0)
        if rank == 0:
            whole, theirs = opt.state_dict(), ref_opt.state_dict()
            assert whole["state"].keys() == theirs["state"].keys()
            for k, state in theirs["state"].items():
                for key, value in state.items():
                    torch.testing.assert_close(whole["state"][k][key], value, atol=ATOL, rtol=0)

    return case


def _uneven_buckets(rank: int, world: int) -> None:
    """One bucket per tensor (cap 0): buckets of 35, 7, 21, 3, 6 and 2 elements, some smaller
    than the world: every rank still owns the same number of elements of each."""
    model, opt = _sharded(0.0, SGD)
    assert [p.numel() for p in model.module.parameters()] == [35, 7, 21, 3, 6, 2]
    assert model.num_buckets == 6
    sizes = [b.size for b in opt._buckets]
    everyone = [None] * world
    dist.all_gather_object(everyone, sizes)
    assert all(s == sizes for s in everyone), everyone
    assert sizes == [-(-spec.numel // world) for spec in model.reducer.plan]
    _parity(SGD, 0.0)(rank, world)


def _no_sync(rank: int, world: int) -> None:
    """Two micro-batches, the first under no_sync: one reduce-scatter of their sum."""
    model, opt = _sharded(25.0, ADAM)
    ref = _model()
    ref_opt = torch.optim.Adam(ref.parameters(), **ADAM[1])
    for step in range(3):
        opt.zero_grad()
        (x1, y1), (x2, y2) = _batch(2 * step, world), _batch(2 * step + 1, world)
        with model.no_sync():
            (_loss(model, _mine(x1, rank), _mine(y1, rank)) / 2).backward()
        with pytest.raises(RuntimeError, match="needs a synchronised backward"):
            opt.step()
        (_loss(model, _mine(x2, rank), _mine(y2, rank)) / 2).backward()
        opt.step()
        ref_opt.zero_grad()
        ((_loss(ref, x1, y1) + _loss(ref, x2, y2)) / 2).backward()
        ref_opt.step()
        for p, q in zip(model.module.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p, q, atol=ATOL, rtol=0)
        _assert_replicas_identical(model.module, world, f"step {step}")


def _resume_bitwise(rank: int, world: int) -> None:
    """3 steps, the whole state to rank 0 and back out to fresh ranks (as a checkpoint does),
    2 more steps: bitwise the run that never stopped. The same state loads into the plain
    optimizer too."""
    model, opt = _sharded(0.0001, ADAM)
    for step in range(5):
        _step(model, opt, rank, world, step)
    straight = [p.detach().clone() for p in model.module.parameters()]

    model, opt = _sharded(0.0001, ADAM)
    for step in range(3):
        _step(model, opt, rank, world, step)
    opt.consolidate_state_dict(to=0)
    saved = [opt.state_dict() if rank == 0 else None, model.module.state_dict()]
    dist.broadcast_object_list(saved, group_src=0)
    resumed, ropt = _sharded(0.0001, ADAM)
    resumed.module.load_state_dict(saved[1])
    ropt.load_state_dict(saved[0])
    for step in range(3, 5):
        _step(resumed, ropt, rank, world, step)
    for p, q in zip(resumed.module.parameters(), straight, strict=True):
        assert torch.equal(p, q), "a resumed sharded run differs from the uninterrupted one"
    plain = torch.optim.Adam(_model().parameters(), **ADAM[1])
    plain.load_state_dict(saved[0])  # a sharded checkpoint is a plain optimizer's


def _overlapped_all_gather(rank: int, world: int) -> None:
    """overlap_all_gather: step() returns with the all-gathers in flight, the next forward waits
    for them; bitwise the run that waits in step()."""
    model, opt = _sharded(0.0001, ADAM)
    for step in range(4):
        _step(model, opt, rank, world, step)
    waited = [p.detach().clone() for p in model.module.parameters()]
    model = DistributedDataParallel(_model(), bucket_cap_mb=0.0001)
    opt = ShardedOptimizer(model, torch.optim.Adam, overlap_all_gather=True, **ADAM[1])
    for step in range(4):
        _step(model, opt, rank, world, step)
    opt.wait()
    for p, q in zip(model.module.parameters(), waited, strict=True):
        assert torch.equal(p, q)
    _assert_replicas_identical(model.module, world, "overlapped")


def _refusals(rank: int, world: int) -> None:
    model, opt = _sharded(25.0, SGD)
    with pytest.raises(RuntimeError, match=r"join\(\) .* not supported with ShardedOptimizer"):
        model.join()
    with pytest.raises(RuntimeError, match="comm hook would have to reduce-scatter"):
        model.register_comm_hook(None, lambda state, bucket: None)
    with pytest.raises(RuntimeError, match="already sharded"):
        ShardedOptimizer(model, torch.optim.SGD, lr=0.1)
    unused = DistributedDataParallel(_model(), find_unused_parameters=True)
    with pytest.raises(ValueError, match="find_unused_parameters=True"):
        ShardedOptimizer(unused, torch.optim.SGD, lr=0.1)
    theirs = nn.parallel.DistributedDataParallel(_model())
    with pytest.raises(TypeError, match="ZeroRedundancyOptimizer"):
        ShardedOptimizer(theirs, torch.optim.SGD, lr=0.1)
    with pytest.raises(RuntimeError, match="consolidate_state_dict"):
        opt.state_dict()


def _vs_torch_zero(optim):
    """The same job under torch's DDP with torch's ZeroRedundancyOptimizer: the same
    parameters every step, and ours holds 1/N of the state on every rank."""

    def case(rank: int, world: int) -> None:
        model, opt = _sharded(25.0, optim)
        theirs = nn.parallel.DistributedDataParallel(_model())
        zero = ZeroRedundancyOptimizer(theirs.parameters(), optimizer_class=optim[0], **optim[1])
        for step in range(4):
            _step(model, opt, rank, world, step)
            _step(theirs, zero, rank, world, step)
            for p, q in zip(model.module.parameters(), theirs.module.parameters(), strict=True):
                torch.testing.assert_close(p, q, atol=ATOL, rtol=0, msg=f"step {step}")
        total = sum(p.numel() for p in model.module.parameters())
        mine = torch.tensor([_state_elements(opt), _state_elements(zero)])
        dist.all_reduce(mine)  # over the ranks: ours is the whole state once, plus padding
        per_tensor = 2 if optim is ADAM else 1
        assert per_tensor * total <= mine[0] <= per_tensor * (total + world) + world
        assert mine[1] >= per_tensor * total

    return case


CASES = {
    "sgd_momentum_parity": _parity(SGD, 0.0001),
    "adam_parity": _parity(ADAM, 0.0001),
    "uneven_buckets": _uneven_buckets,
    "no_sync": _no_sync,
    "resume_bitwise": _resume_bitwise,
    "overlapped_all_gather": _overlapped_all_gather,
    "refusals": _refusals,
    "vs_torch_zero_sgd": _vs_torch_zero(SGD),
    "vs_torch_zero_adam": _vs_torch_zero(ADAM),
}


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def results(request, tmp_path_factory):
    rdzv = tmp_path_factory.mktemp("rdzv")
    return run_ranks(run_cases, request.param, rdzv, __name__, list(CASES), timeout_s=400)


@pytest.mark.timeout(500)
@pytest.mark.parametrize("case", list(CASES))
def test_case_on_every_rank(results, case):
    verdicts(results, case)
