"""Real gloo ranks: our DDP against one process on the global batch and against torch's DDP.

Each spawn costs a few seconds of process start-up on 2 cores, so one spawn runs a whole family
of cases and returns a verdict per case; the tests then report case by case.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ddp import DistributedDataParallel
from tests.ddp.common import (
    BatchNormNet,
    Branches,
    Deep,
    assert_same_params,
    case_tests,
    run_cases,
    seeded,
    verdicts,
)
from tests.helpers import run_ranks

ATOL = 1e-5
STEPS = 4


# ---- models -----------------------------------------------------------------------------------


class _Deep(Deep):
    def __init__(self) -> None:
        super().__init__(depth=6)


class _Tied(nn.Module):
    """One Linear used twice in forward, and a second module sharing the first's weight."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(24, 24)
        self.b = nn.Linear(24, 24)
        self.b.weight = self.a.weight
        self.head = nn.Linear(24, 4)

    def forward(self, x):
        return self.head(self.b(torch.relu(self.a(torch.relu(self.a(x))))))


class _Frozen(_Deep):
    def __init__(self) -> None:
        super().__init__()
        for p in self.layers[0].parameters():
            p.requires_grad_(False)


class _MixedDtype(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(24, 24).double()
        self.b = nn.Linear(24, 4)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x.double())).float())


# ---- helpers ----------------------------------------------------------------------------------


def _data(rank: int, world: int, steps: int = STEPS, local: int = 6):
    """Per step: the global batch (all ranks') and this rank's slice of it."""
    g = torch.Generator().manual_seed(1234)
    batches = []
    for _ in range(steps):
        x = torch.randn(world * local, 24, generator=g)
        y = torch.randint(0, 4, (world * local,), generator=g)
        batches.append((x, y, slice(rank * local, (rank + 1) * local)))
    return batches


def _sgd(m: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.1, momentum=0.9)


def _assert_params_close(a: nn.Module, b: nn.Module, step: int) -> None:
    assert_same_params(a, b, ATOL, f"step {step}")


def _vs_torch(cls, find_unused: bool = False, **ours_kwargs) -> Callable[[int, int], None]:
    def case(rank: int, world: int) -> None:
        ours_m, theirs_m = seeded(cls), seeded(cls)
        ours = DistributedDataParallel(ours_m, find_unused_parameters=find_unused, **ours_kwargs)
        theirs = nn.parallel.DistributedDataParallel(
            theirs_m,
            find_unused_parameters=find_unused,
            gradient_as_bucket_view=ours_kwargs.get("gradient_as_bucket_view", False),
        )
        opt_o, opt_t = _sgd(ours_m), _sgd(theirs_m)
        for step, (x, y, mine) in enumerate(_data(rank, world)):
            for model, opt in ((ours, opt_o), (theirs, opt_t)):
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(x[mine]), y[mine]).backward()
                opt.step()
            _assert_params_close(ours_m, theirs_m, step)
            for (name, p), q in zip(ours_m.named_parameters(), theirs_m.parameters(), strict=True):
                assert (p.grad is None) == (q.grad is None), f"{name}: .grad None-ness differs"

    return case


def _vs_single_process(cap_mb: float, overlap: bool, as_view: bool) -> Callable[[int, int], None]:
    """DDP on the local slice must equal one process on the global batch, every step."""

    def case(rank: int, world: int) -> None:
        model, ref = seeded(_Deep), seeded(_Deep)
        ddp = DistributedDataParallel(
            model, bucket_cap_mb=cap_mb, overlap=overlap, gradient_as_bucket_view=as_view
        )
        opt, ref_opt = _sgd(model), _sgd(ref)
        for step, (x, y, mine) in enumerate(_data(rank, world)):
            opt.zero_grad(set_to_none=not as_view)
            F.cross_entropy(ddp(x[mine]), y[mine]).backward()
            opt.step()
            ref_opt.zero_grad()
            F.cross_entropy(ref(x), y).backward()
            ref_opt.step()
            _assert_params_close(model, ref, step)
        if cap_mb == 0:
            assert ddp.num_buckets == len(list(model.parameters()))

    return case


def _no_sync_accumulation(rank: int, world: int) -> None:
    """K micro-batches, K-1 of them under no_sync(), equal one step on the whole batch."""
    k = 3
    model, ref = seeded(_Deep), seeded(_Deep)
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.001)
    opt, ref_opt = _sgd(model), _sgd(ref)
    for step, (x, y, mine) in enumerate(_data(rank, world, local=6 * k)):
        opt.zero_grad()
        xs, ys = x[mine].chunk(k), y[mine].chunk(k)
        for i in range(k):
            loss = F.cross_entropy(ddp(xs[i]), ys[i]) / k
            if i < k - 1:
                with ddp.no_sync():
                    assert not ddp.require_backward_grad_sync
                    loss.backward()
            else:
                loss.backward()
        assert ddp.require_backward_grad_sync  # restored by no_sync's finally
        opt.step()
        ref_opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        ref_opt.step()
        _assert_params_close(model, ref, step)


def _unused_without_flag_raises(rank: int, world: int) -> None:
    ddp = DistributedDataParallel(seeded(Branches))
    x, y, mine = _data(rank, world)[0]
    with pytest.raises(RuntimeError, match="find_unused_parameters=True") as err:
        F.cross_entropy(ddp(x[mine]), y[mine]).backward()
    # every rank names the same parameters, with how many ranks missed them
    assert "never.weight (on 2 of 2 ranks)" in str(err.value)
    assert "b.weight (on 1 of 2 ranks)" in str(err.value)


def _different_models_raise(rank: int, world: int) -> None:
    module = seeded(_Deep) if rank == 0 else nn.Sequential(seeded(_Deep), nn.Linear(4, 4))
    with pytest.raises(RuntimeError, match="ranks built different models"):
        DistributedDataParallel(module)


class _NoTrainable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.frozen = nn.Linear(24, 4).requires_grad_(False)

    def forward(self, x):
        return self.frozen(x)


class _Idle(nn.Module):
    """With ``idle`` the forward touches no parameter at all."""

    def __init__(self, idle: bool) -> None:
        super().__init__()
        self.idle = idle
        self.a = nn.Linear(24, 4)

    def forward(self, x):
        return x[:, :4] * 1.0 if self.idle else self.a(x)


def _nothing_to_reduce(rank: int, world: int) -> None:
    """No trainable parameter at all is refused as torch refuses it; none used on rank 1
    (which then has no backward to run): the allreduce must still happen, with rank 1
    contributing zeros. (torch's DDP hangs there: rank 1 never launches its buckets.)"""
    with pytest.raises(RuntimeError, match="doesn't have any parameter that requires a grad"):
        DistributedDataParallel(seeded(_NoTrainable))
    torch.manual_seed(0)
    ours = DistributedDataParallel(_Idle(idle=rank == 1), find_unused_parameters=True)
    torch.manual_seed(0)
    ref = _Idle(idle=False)
    for x, y, _ in _data(rank, world):
        local = slice(0, 6)  # rank 0's slice: the only rank whose forward used parameters
        out = ours(x[local])
        if out.requires_grad:
            F.cross_entropy(out, y[local]).backward()
        ref.zero_grad()
        (F.cross_entropy(ref(x[local]), y[local]) / world).backward()
        for p, q in zip(ours.module.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, atol=ATOL, rtol=0)
        ours.module.zero_grad()


def _replicas_start_equal(rank: int, world: int) -> None:
    model = seeded(BatchNormNet, seed=rank)  # deliberately different initial weights per rank
    DistributedDataParallel(model)
    ref = seeded(BatchNormNet, seed=0)
    _assert_params_close(model, ref, step=-1)


def _four_ranks(rank: int, world: int) -> None:
    _vs_single_process(0.002, True, as_view=False)(rank, world)
    _vs_torch(Branches, find_unused=True)(rank, world)


CASES = {
    "batchnorm": _vs_torch(BatchNormNet),
    "tied": _vs_torch(_Tied),
    "frozen": _vs_torch(_Frozen, bucket_cap_mb=0.001),
    "unused_by_rank": _vs_torch(Branches, find_unused=True, bucket_cap_mb=0.001),
    "unused_by_rank_no_overlap": _vs_torch(Branches, find_unused=True, overlap=False),
    "unused_bucket_view": _vs_torch(Branches, find_unused=True, gradient_as_bucket_view=True),
    "mixed_dtype": _vs_torch(_MixedDtype),
    "bucket_view": _vs_torch(_Deep, bucket_cap_mb=0.002, gradient_as_bucket_view=True),
    "no_sync": _no_sync_accumulation,
    "unused_without_flag": _unused_without_flag_raises,
    "different_models": _different_models_raise,
    "broadcast_at_construction": _replicas_start_equal,
    "four_rank_mix": _four_ranks,
    "nothing_to_reduce": _nothing_to_reduce,
}
for _cap in (0, 0.002, 25, 1000):
    for _overlap in (True, False):
        CASES[f"single_process_cap{_cap}_overlap{_overlap}"] = _vs_single_process(
            _cap, _overlap, as_view=False
        )
CASES["single_process_bucket_view"] = _vs_single_process(0.002, True, as_view=True)


results, test_case_on_every_rank = case_tests(__name__, CASES, timeout_s=150)


@pytest.mark.timeout(200)
def test_four_ranks(tmp_path):
    results = run_ranks(run_cases, 4, tmp_path, __name__, ["four_rank_mix"], timeout_s=150)
    verdicts(results, "four_rank_mix")
