"""The lesson's wrapper (``ddp.lesson``) is bitwise the full wrapper and torch's DDP.

On the lesson's model (``mini``, a 3-layer MLP) at 4 ranks, three buckets, four steps, one of
them accumulating two micro-batches under ``no_sync()``: after every backward and every step,
the gradients and parameters of the three are equal to the last bit.

Equal to the last bit needs every element summed in the same order. gloo's ring allreduce cuts
a flat buffer into 2 x world segments and starts each segment's sum at a different rank, so
the order depends on each element's position in its bucket and on the bucket's length. Hence
the two settings below:

* torch's DDP with ``find_unused_parameters=True``: it then keeps its construction-time plan,
  the one the lesson builds (filled in registration order, launched last bucket first). By
  default torch reduces the first step in a single bucket and rebuilds the buckets in the
  recorded gradient order before the second, which moves gradients to other positions.
* the full wrapper with the same setting and torch's ``allreduce_hook`` (divide, allreduce:
  what its built-in path does). Without a hook the full wrapper appends one "no gradient
  here" count per parameter to each bucket; that lengthens the buffer, and mini's buckets
  (all multiples of 8 elements) then get segments one element longer, so a few elements near
  the boundaries are summed in another order. The test checks that too: without the hook the
  full wrapper ends within 1e-6 of the lesson, and not equal to the last bit.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from ddp import DistributedDataParallel
from ddp.lesson import DistributedDataParallel as LessonDDP
from ddp.program.models import IN_FEATURES, NUM_CLASSES, build_model
from tests.ddp.common import case_tests

CAP_MB = 8 / 1024  # 8 KB: mini's 6 tensors in 3 buckets (first layer's weight alone)
SAME = {"rtol": 0, "atol": 0}


def _batches(rank: int, micro: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(100 + rank + 7 * micro)
    xs = [torch.randn(16, IN_FEATURES, generator=g) for _ in range(micro)]
    return [(x, torch.randint(0, NUM_CLASSES, (16,), generator=g)) for x in xs]


def _assert_bitwise(models: dict[str, nn.Module], what: str, grads: bool) -> None:
    """Every other model's parameters (or gradients) equal the lesson's, to the last bit."""
    mine = list(models["lesson"].module.named_parameters())
    for name in ("torch", "ours"):
        for (pname, p), q in zip(mine, models[name].module.parameters(), strict=True):
            a, b = (p.grad, q.grad) if grads else (p, q)
            label = f"{what}, {name}'s {pname}{' gradient' if grads else ''}"
            torch.testing.assert_close(a, b, **SAME, msg=lambda m, w=label: f"{w}: {m}")


def _bitwise(rank: int, world: int) -> None:
    assert world == 4
    launched_before_last = []
    # Registered before the lesson's own hook, so it sees the lesson just before the first
    # layer's weight, the last gradient of backward, is handed over.
    lesson_model = build_model("mini", 0)
    lesson_model.net[0].weight.register_post_accumulate_grad_hook(
        lambda _p: launched_before_last.append(lesson.next_launch)
    )
    lesson = LessonDDP(lesson_model, bucket_cap_mb=CAP_MB)
    theirs = nn.parallel.DistributedDataParallel(
        build_model("mini", 0), bucket_cap_mb=CAP_MB, find_unused_parameters=True
    )
    ours = DistributedDataParallel(
        build_model("mini", 0), bucket_cap_mb=CAP_MB, find_unused_parameters=True
    )
    ours.register_comm_hook(None, default_hooks.allreduce_hook)
    counts_in_tail = DistributedDataParallel(
        build_model("mini", 0), bucket_cap_mb=CAP_MB, find_unused_parameters=True
    )
    assert [len(b.params) for b in lesson.buckets] == [3, 2, 1]
    assert lesson.buckets[-1].params[0] is lesson_model.net[0].weight
    models = {"lesson": lesson, "torch": theirs, "ours": ours, "counts_in_tail": counts_in_tail}
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for k, m in models.items()}
    for step, micro in enumerate((1, 2, 1, 1)):
        batches = _batches(rank, micro)
        for name, model in models.items():
            opts[name].zero_grad(set_to_none=True)
            for j, (x, y) in enumerate(batches):
                last = j == micro - 1
                with contextlib.nullcontext() if last else model.no_sync():
                    F.cross_entropy(model(x), y).backward()
        _assert_bitwise(models, f"step {step}", grads=True)
        for opt in opts.values():
            opt.step()
        _assert_bitwise(models, f"after step {step}", grads=False)
    pairs = zip(lesson.parameters(), counts_in_tail.parameters(), strict=True)
    differing = sum(int((p != q).sum()) for p, q in pairs)
    assert differing > 0, "the counts in the buckets' tails moved no segment boundary"
    for p, q in zip(lesson.parameters(), counts_in_tail.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)
    # Overlap: when backward hands over its last gradient, the first two buckets are already
    # on the wire, in every synchronised backward (the no_sync one launches nothing).
    assert launched_before_last == [2, 0, 2, 2, 2], launched_before_last


CASES = {"bitwise_equal_to_full_wrapper_and_torch": _bitwise}

results, test_case_on_every_rank = case_tests(__name__, CASES, world=4, timeout_s=150)
