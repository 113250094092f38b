"""Communication hooks: torch's own hooks, and user hooks, give torch DDP's parameters."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

from ddp import DistributedDataParallel
from ddp.wrapper.comm_hooks import COMM_HOOKS, gloo_bf16_compress_hook, register_named_hook
from ddp.wrapper.grad_bucket import GradBucket, hook_result
from ddp.wrapper.hook_names import TOPOLOGY_HOOKS
from tests.ddp.common import (
    Branches,
    Deep,
    batches,
    case_tests,
    seeded,
    torch_pair,
    train_both,
    train_step,
)

ATOL = 1e-6
STEPS = 6


def _user_hook(state, bucket):  # unannotated: torch compares annotations as objects
    t = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0])


def _powersgd_state():
    return powersgd.PowerSGDState(
        process_group=None,
        matrix_approximation_rank=1,
        start_powerSGD_iter=2,
        use_error_feedback=True,
        warm_start=True,
    )


HOOKS = {
    "allreduce": lambda: (None, default_hooks.allreduce_hook),
    "fp16": lambda: (None, default_hooks.fp16_compress_hook),
    "bf16": lambda: (None, gloo_bf16_compress_hook),
    "powersgd": lambda: (_powersgd_state(), powersgd.powerSGD_hook),
    "fp16_powersgd": lambda: (
        _powersgd_state(),
        default_hooks.fp16_compress_wrapper(powersgd.powerSGD_hook),
    ),
    "user": lambda: (None, _user_hook),
}


def _vs_torch(hook: str, cls=Deep, **kwargs):
    def case(rank: int, world: int) -> None:
        ours, theirs = torch_pair(cls, **kwargs)
        ours.register_comm_hook(*HOOKS[hook]())
        theirs.register_comm_hook(*HOOKS[hook]())
        train_both(ours, theirs, rank, STEPS, ATOL)

    return case


def _named(name: str, **kwargs):
    def case(rank: int, world: int) -> None:
        ours, theirs = torch_pair(Deep, **kwargs)
        state = register_named_hook(ours, name)
        register_named_hook(theirs, name)
        assert isinstance(state, powersgd.PowerSGDState) == (name == "powersgd")
        # on one host the topology hooks find one node and leave the built-in allreduce
        registers = name not in ("none", *TOPOLOGY_HOOKS)
        assert ("comm_hook" in ours._get_ddp_logging_data()) == registers
        train_both(ours, theirs, rank, STEPS, ATOL)

    return case


def _what_hooks_see(rank: int, world: int) -> None:
    """Both wrappers hand the same hook the same bucket: index, is_last, sizes, shapes, and a
    buffer of unaveraged gradients only (the unused-parameter counts never show)."""
    seen: dict[str, list] = {"ours": [], "torch": []}

    def spy(who):
        def hook(state, bucket):
            params = bucket.parameters()
            seen[who].append(
                (
                    bucket.index(),
                    bucket.is_last(),
                    bucket.buffer().numel(),
                    [tuple(g.shape) for g in bucket.gradients()],
                    [tuple(p.shape) for p in params],
                    bucket.buffer().clone(),
                )
            )
            assert bucket.buffer().numel() == sum(p.numel() for p in params)
            return default_hooks.allreduce_hook(state, bucket)

        return hook

    ours, theirs = torch_pair(Deep)
    ours.register_comm_hook(None, spy("ours"))
    theirs.register_comm_hook(None, spy("torch"))
    # torch lays a bucket out in registration order until its first iteration has shown the
    # gradients' ready order, then rebuilds it in that order, which ours uses from the start.
    train_both(ours, theirs, rank, 3, ATOL)
    assert len(seen["ours"]) == len(seen["torch"]) == 3 * ours.num_buckets
    for a, b in zip(seen["ours"][1:], seen["torch"][1:], strict=True):
        assert a[:5] == b[:5]
        torch.testing.assert_close(a[5], b[5], atol=0, rtol=0)
    # With unused parameters the counts travel apart: the hook's buffer is gradients only.
    counted = DistributedDataParallel(seeded(Branches), find_unused_parameters=True)
    counted.register_comm_hook(None, spy("ours"))
    x, y = batches(rank, 1)[0]
    F.cross_entropy(counted(x), y).backward()
    assert counted.module.never.weight.grad is None


class _OneMatrix(nn.Module):
    """One matrix PowerSGD compresses; the vector ``scale`` is used on even ranks only and
    ``never`` nowhere. (With several compressible matrices in a bucket, PowerSGD's random
    start depends on their order in the bucket, and torch keeps registration order there
    when find_unused_parameters is on; this wrapper uses gradient-ready order.)"""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(24, 24)
        self.scale = nn.Parameter(torch.ones(24))
        self.never = nn.Parameter(torch.ones(24))

    def forward(self, x):
        h = self.a(x)
        return h * self.scale if dist.get_rank() % 2 == 0 else h


def _powersgd_find_unused(rank: int, world: int) -> None:
    """PowerSGD with unused parameters. (torch's DDP aborts in gloo here: its unused-map
    allreduce races PowerSGD's chained collectives.) Vectors travel uncompressed, so a vector
    used on rank 0 only must get exactly the mean of the local gradients, rank 1's being 0,
    and a parameter no rank uses keeps .grad None."""
    ours = DistributedDataParallel(seeded(_OneMatrix), find_unused_parameters=True)
    ours.register_comm_hook(*HOOKS["powersgd"]())
    plain = seeded(_OneMatrix)
    opt = torch.optim.SGD(ours.parameters(), lr=0.1)
    for step, (x, y) in enumerate(batches(rank, STEPS)):
        plain.load_state_dict(ours.module.state_dict())
        F.cross_entropy(plain(x), y).backward()
        local = plain.scale.grad if plain.scale.grad is not None else torch.zeros(24)
        dist.all_reduce(local)
        train_step(ours, opt, x, y)
        assert ours.module.never.grad is None, f"step {step}"
        torch.testing.assert_close(ours.module.scale.grad, local / world, atol=ATOL, rtol=0)
        plain.zero_grad(set_to_none=True)
        weight = ours.module.a.weight.detach().clone()
        dist.broadcast(weight, 0)
        torch.testing.assert_close(ours.module.a.weight, weight, atol=0, rtol=0)


def _register_twice_raises(rank: int, world: int) -> None:
    ours = DistributedDataParallel(seeded(Deep))
    ours.register_comm_hook(None, default_hooks.allreduce_hook)
    with pytest.raises(RuntimeError, match="can only be called once"):
        ours.register_comm_hook(None, default_hooks.allreduce_hook)
    other = DistributedDataParallel(seeded(Deep))
    x, y = batches(rank, 1)[0]
    loss = F.cross_entropy(other(x), y)
    with pytest.raises(RuntimeError, match="between a forward and its backward"):
        other.register_comm_hook(None, default_hooks.allreduce_hook)
    loss.backward()
    with pytest.raises(ValueError, match="unknown communication hook 'zip'"):
        register_named_hook(other, "zip")


def _hook_without_find_unused_raises(rank: int, world: int) -> None:
    ours = DistributedDataParallel(seeded(Branches))
    ours.register_comm_hook(None, default_hooks.fp16_compress_hook)
    x, y = batches(rank, 1)[0]
    with pytest.raises(RuntimeError, match=r"never.weight \(on this rank\).*find_unused_param"):
        F.cross_entropy(ours(x), y).backward()


CASES = {f"{h}_vs_torch": _vs_torch(h) for h in HOOKS}
CASES.update(
    {
        "allreduce_bucket_view": _vs_torch("allreduce", gradient_as_bucket_view=True),
        "fp16_find_unused": _vs_torch("fp16", Branches, find_unused_parameters=True),
        "powersgd_find_unused": _powersgd_find_unused,
        "bf16_small_buckets": _vs_torch("bf16", bucket_cap_mb=0.002),
        "what_hooks_see": _what_hooks_see,
        "register_twice": _register_twice_raises,
        "hook_unused_raises": _hook_without_find_unused_raises,
    }
)
CASES.update({f"named_{n}": _named(n) for n in COMM_HOOKS})


def _powersgd_many_buckets(rank: int, world: int) -> None:
    """Several buckets (after the rebuild): the same layout as torch's, first and rebuilt,
    hence PowerSGD's per-bucket state and random start agree, and the
    named hook keeps PowerSGD's chained collectives from interleaving with the next bucket's
    differently on different ranks (gloo would pair mismatched ones and abort)."""
    ours, theirs = torch_pair(Deep, bucket_cap_mb=0.002)
    register_named_hook(ours, "powersgd")
    register_named_hook(theirs, "powersgd")
    train_both(ours, theirs, rank, STEPS, ATOL)
    assert ours.num_buckets > 2, "rebuilt by the cap after the first iteration"
    ours_data, theirs_data = ours._get_ddp_logging_data(), theirs._get_ddp_logging_data()
    for key in ("bucket_sizes", "rebuilt_bucket_sizes", "rebuilt_per_bucket_param_indices"):
        assert ours_data[key] == theirs_data[key], (key, ours_data[key], theirs_data[key])


CASES["named_powersgd_many_buckets"] = _powersgd_many_buckets


results, test_case_on_every_rank = case_tests(__name__, CASES)


def test_grad_bucket_views_and_results():
    params = [torch.zeros(2, 3), torch.zeros(4)]
    buf = torch.arange(10.0)
    bucket = GradBucket(1, buf, False, params)
    grads = bucket.gradients()
    assert [g.shape for g in grads] == [(2, 3), (4,)]
    grads[1].fill_(-1)  # views: writing a gradient writes the buffer
    assert buf[6:].tolist() == [-1.0] * 4
    assert (bucket.index(), bucket.is_last()) == (1, False)
    bucket.set_buffer(buf.half())
    assert bucket.buffer().dtype == torch.float16
    assert hook_result([buf], 1, 10) is buf
    with pytest.raises(ValueError, match="returned 3 elements for bucket 1"):
        hook_result(torch.zeros(3), 1, 10)
    with pytest.raises(TypeError, match="resolved to str"):
        hook_result("x", 1, 10)
