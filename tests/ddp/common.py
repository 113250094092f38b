"""Shared by the tests of torch's DDP API on this wrapper: one spawn per test module runs a
family of named cases on every rank (process start-up costs seconds on 2 cores) and returns a
verdict per case, as in tests/test_ddp_multirank.py."""

from __future__ import annotations

import gc
import importlib
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ddp import DistributedDataParallel
from ddp.program.config import Rendezvous
from tests.helpers import run_ranks

__all__ = [
    "BatchNormNet",
    "Branches",
    "Deep",
    "assert_same_params",
    "batches",
    "case_tests",
    "run_cases",
    "seeded",
    "torch_pair",
    "train_both",
    "train_step",
    "verdicts",
]


def run_cases(rdzv: Rendezvous, module: str, names: list[str]) -> dict[str, str]:
    """On one rank: run ``module.CASES[name](rank, world)`` for each name; 'ok' or the error.
    Names and a module path cross the process boundary: closures do not pickle."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=rdzv.init_method, rank=rdzv.rank, world_size=rdzv.world_size
    )
    cases = importlib.import_module(module).CASES
    out = {}
    try:
        for name in names:
            try:
                cases[name](rdzv.rank, rdzv.world_size)
                out[name] = "ok"
            except Exception:
                out[name] = traceback.format_exc()
            dist.barrier()
    finally:
        gc.collect()  # the cases' wrappers hold the group through cycles: free them first
        dist.destroy_process_group()
    return out


def case_tests(module: str, cases: dict, world: int = 2, timeout_s: float = 200):
    """The module-scoped fixture that runs every case of ``module`` in one spawn of ``world``
    gloo ranks, and the test that reports each case per rank. Assign both at module level:
    ``results, test_case_on_every_rank = case_tests(__name__, CASES)``."""

    @pytest.fixture(scope="module")
    def results(tmp_path_factory):
        rdzv = tmp_path_factory.mktemp("rdzv")
        return run_ranks(run_cases, world, rdzv, module, list(cases), timeout_s=timeout_s)

    @pytest.mark.timeout(300)
    @pytest.mark.parametrize("case", list(cases))
    def test_case_on_every_rank(results, case):
        verdicts(results, case)

    return results, test_case_on_every_rank


def verdicts(results: dict[int, dict[str, str]], case: str) -> None:
    for rank, per_case in sorted(results.items()):
        assert per_case[case] == "ok", f"rank {rank}:\n{per_case[case]}"


class Deep(nn.Module):
    def __init__(self, depth: int = 4, width: int = 24) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x)


class BatchNormNet(nn.Module):
    """A BatchNorm layer: running stats are buffers that DDP must broadcast."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(24, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, x):
        return self.net(x)


class Branches(nn.Module):
    """``b`` runs only on even ranks; ``never`` runs nowhere."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(24, 24)
        self.b = nn.Linear(24, 24)
        self.never = nn.Linear(24, 24)
        self.head = nn.Linear(24, 4)

    def forward(self, x):
        h = torch.relu(self.a(x))
        if dist.get_rank() % 2 == 0:
            h = h + torch.relu(self.b(x))
        return self.head(h)


def seeded(cls, *args, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return cls(*args)


def batches(rank: int, n: int, local: int = 6, seed: int = 1234):
    """``n`` (x, y) batches of this rank, different per rank."""
    g = torch.Generator().manual_seed(seed + 7919 * rank)
    return [
        (torch.randn(local, 24, generator=g), torch.randint(0, 4, (local,), generator=g))
        for _ in range(n)
    ]


def train_step(model: nn.Module, opt: torch.optim.Optimizer, x, y) -> None:
    opt.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    opt.step()


def torch_pair(
    cls, hook=None, ours: dict | None = None, **kwargs
) -> tuple[DistributedDataParallel, nn.parallel.DistributedDataParallel]:
    """Ours and torch's DDP, each around its own ``seeded(cls)``, built with the same ``kwargs``
    (``ours`` overrides some for ours only); a stateless ``hook`` is registered on both."""
    ours_m, theirs_m = seeded(cls), seeded(cls)
    mine = DistributedDataParallel(ours_m, **{**kwargs, **(ours or {})})
    theirs = nn.parallel.DistributedDataParallel(theirs_m, **kwargs)
    if hook is not None:
        mine.register_comm_hook(None, hook)
        theirs.register_comm_hook(None, hook)
    return mine, theirs


def train_both(
    ours: nn.Module,
    theirs: nn.Module,
    rank: int,
    steps: int,
    atol: float,
    momentum: float = 0.9,
    what: str = "step",
) -> None:
    """Train ours and torch's DDP side by side on this rank's batches; after every step their
    parameters and buffers must agree to ``atol``, and so must which ``.grad`` is None."""
    opt_o = torch.optim.SGD(ours.parameters(), lr=0.1, momentum=momentum)
    opt_t = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=momentum)
    for step, (x, y) in enumerate(batches(rank, steps)):
        train_step(ours, opt_o, x, y)
        train_step(theirs, opt_t, x, y)
        assert_same_params(ours.module, theirs.module, atol, f"{what} {step}")
        pairs = zip(ours.module.named_parameters(), theirs.module.parameters(), strict=True)
        for (name, p), q in pairs:
            assert (p.grad is None) == (q.grad is None), f"{what} {step} {name}: .grad None-ness"


def assert_same_params(ours: nn.Module, theirs: nn.Module, atol: float, what: str) -> None:
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(
            p, q, atol=atol, rtol=0, msg=lambda m, n=name: f"{what} {n}: {m}"
        )
    for (name, p), q in zip(ours.named_buffers(), theirs.buffers(), strict=True):
        torch.testing.assert_close(
            p, q, atol=atol, rtol=0, msg=lambda m, n=name: f"{what} {n}: {m}"
        )
