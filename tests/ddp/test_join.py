"""Uneven inputs: rank r runs a different number of batches; nobody hangs, and the final
parameters equal torch DDP's under the same scheme."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.join import Join

from ddp import DistributedDataParallel
from tests.ddp.common import (
    BatchNormNet,
    Branches,
    Deep,
    assert_same_params,
    batches,
    case_tests,
    run_cases,
    seeded,
    train_step,
    verdicts,
)
from tests.helpers import run_ranks

ATOL = 1e-6


def _train(model, rank: int, ctx, n: int, no_sync_every: int = 0) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with ctx(model):
        for i, (x, y) in enumerate(batches(rank, n)):
            if no_sync_every and i % no_sync_every == 0:
                with model.no_sync():
                    F.cross_entropy(model(x), y).backward()
                continue
            train_step(model, opt, x, y)


def _vs_torch(
    cls=Deep, ctx="method", hook=None, extra=1, no_sync_every=0, divide_by_initial=True, **kw
):
    """Rank r runs 5 + extra*r batches under the join context ``ctx``."""
    contexts = {
        "method": lambda m, **j: m.join(**j),
        "generic": lambda m, **j: Join([m], **j),
    }

    def case(rank: int, world: int) -> None:
        join_kw = {"divide_by_initial_world_size": divide_by_initial}
        ours_m, theirs_m = seeded(cls), seeded(cls)
        ours = DistributedDataParallel(ours_m, **kw)
        theirs = nn.parallel.DistributedDataParallel(theirs_m, **kw)
        if hook is not None:
            ours.register_comm_hook(None, hook)
            theirs.register_comm_hook(None, hook)
        n = 5 + extra * rank
        for model in (ours, theirs):
            _train(model, rank, lambda m: contexts[ctx](m, **join_kw), n, no_sync_every)
        assert_same_params(ours_m, theirs_m, ATOL, f"rank {rank} after join")
        if ctx == "method":
            assert ours._get_ddp_logging_data().get("join_uneven_inputs") == 1

    return case


def _throw_on_early_termination(rank: int, world: int) -> None:
    model = DistributedDataParallel(seeded(Deep))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    expected = "exhausted all inputs" if rank == 0 else "Detected at least one rank"
    with (
        pytest.raises(RuntimeError, match=expected),
        model.join(throw_on_early_termination=True),
    ):
        for x, y in batches(rank, 3 + 2 * rank):
            train_step(model, opt, x, y)


def _replicas_equal_after_join(rank: int, world: int) -> None:
    model = DistributedDataParallel(seeded(Branches), find_unused_parameters=True)
    _train(model, rank, lambda m: m.join(), 2 + 3 * rank)
    for p in model.parameters():
        q = p.detach().clone()
        dist.broadcast(q, 0)
        torch.testing.assert_close(p, q, atol=0, rtol=0)


CASES = {
    "join_method": _vs_torch(),
    "join_generic": _vs_torch(ctx="generic"),
    "divide_by_active": _vs_torch(divide_by_initial=False, extra=2),
    "allreduce_hook": _vs_torch(hook=default_hooks.allreduce_hook),
    "fp16_hook": _vs_torch(hook=default_hooks.fp16_compress_hook, extra=2),
    "find_unused": _vs_torch(Branches, find_unused_parameters=True),
    "batchnorm_buffers": _vs_torch(BatchNormNet, extra=2),
    "no_sync_while_joined": _vs_torch(extra=3, no_sync_every=2),
    "bucket_view_small_buckets": _vs_torch(gradient_as_bucket_view=True, bucket_cap_mb=0.002),
    "throw_on_early_termination": _throw_on_early_termination,
    "replicas_equal": _replicas_equal_after_join,
}


results, test_case_on_every_rank = case_tests(__name__, CASES)


@pytest.mark.timeout(200)
def test_three_ranks_two_join_early(tmp_path):
    cases = ["join_method", "find_unused", "divide_by_active"]
    results = run_ranks(run_cases, 3, tmp_path, __name__, cases, timeout_s=150)
    for case in cases:
        verdicts(results, case)
