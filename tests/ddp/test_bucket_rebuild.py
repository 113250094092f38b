"""Buckets rebuilt in gradient-ready order: the same buckets, logging keys and parameters as
torch's DDP, on a model whose layers run in the reverse of their registration order (so the
construction-time guess is wrong and the rebuild changes the plan)."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from tests.ddp.common import (
    assert_same_params,
    batches,
    case_tests,
    torch_pair,
    train_both,
    train_step,
)

ATOL = 1e-6
SMALL_CAP_MB = 0.005  # about two 24x24 layers per bucket: several buckets
KEYS = (
    "has_rebuilt_buckets",
    "rebuilt_bucket_sizes",
    "rebuilt_per_bucket_param_indices",
    "prev_iteration_grad_ready_order_indices",
)


class Reversed(nn.Module):
    """Layers applied last-registered first: backward yields the first-registered layer's
    gradients first, the opposite of the reverse-registration guess."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(24, 24) for _ in range(5))
        self.head = nn.Linear(24, 4)

    def forward(self, x):
        for layer in reversed(self.layers):
            x = torch.tanh(layer(x))
        return self.head(x)


def _vs_torch(steps: int = 4, hook=None, **kw):
    def case(rank: int, world: int) -> None:
        ours, theirs = torch_pair(Reversed, hook, bucket_cap_mb=SMALL_CAP_MB, **kw)
        initial = ours.reducer.plan
        train_both(ours, theirs, rank, steps, ATOL)
        ours_data, theirs_data = ours._get_ddp_logging_data(), theirs._get_ddp_logging_data()
        for key in KEYS:
            assert ours_data.get(key) == theirs_data.get(key), key
        rebuilt = kw.get("static_graph") or not kw.get("find_unused_parameters")
        assert ours_data["has_rebuilt_buckets"] == int(bool(rebuilt))
        assert (ours.reducer.plan != initial) == bool(rebuilt), "the guess was wrong"
        if kw.get("gradient_as_bucket_view"):
            views = ours.reducer._views
            for p, view in zip(ours.reducer._params, views, strict=True):
                assert p.grad.data_ptr() == view.data_ptr(), "grads moved into the new buckets"

    return case


def _join_before_rebuild(rank: int, world: int) -> None:
    """Rank 0 runs out after one batch, before the rebuild: its join hook still takes part in
    the rebuild's broadcast and shadows the rebuilt buckets."""
    ours, theirs = torch_pair(Reversed, bucket_cap_mb=SMALL_CAP_MB)
    for model in (ours, theirs):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with model.join():
            for x, y in batches(rank, 1 + 3 * rank):
                train_step(model, opt, x, y)
    assert_same_params(ours.module, theirs.module, ATOL, f"rank {rank} after join")
    assert ours._get_ddp_logging_data()["has_rebuilt_buckets"] == 1


CASES = {
    "default": _vs_torch(),
    "bucket_view": _vs_torch(gradient_as_bucket_view=True),
    "find_unused_keeps_plan": _vs_torch(find_unused_parameters=True),
    "static_graph_third_forward": _vs_torch(steps=5, static_graph=True),
    "fp16_hook": _vs_torch(hook=default_hooks.fp16_compress_hook),
    "join_before_rebuild": _join_before_rebuild,
}


results, test_case_on_every_rank = case_tests(__name__, CASES)
