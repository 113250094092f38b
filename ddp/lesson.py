"""Data parallelism in one file: the wrapper as a reader would write it after the lesson.

N processes (ranks) each hold a full copy of the model and train on their own slice of the
batch. They stay one model because of two rules:

1. every replica starts from the same weights: rank 0's, broadcast at construction;
2. before the optimizer steps, every gradient is replaced by its mean over the ranks.

Then every rank applies the same update to the same weights, and the result is what one
process would get on the whole batch. Rule 2 is where the engineering is:

* **A hook per parameter.** Backward produces gradients one parameter at a time, last layer
  first. A post-accumulate-grad hook on each parameter tells us when its ``.grad`` is final.
* **Buckets.** An allreduce pays a latency floor however small the tensor, so one call per
  parameter wastes it many times per step. Gradients are copied into a few flat buffers
  (buckets) instead, and each bucket is reduced in one call.
* **Overlap.** A bucket is launched (an asynchronous allreduce) as soon as its last gradient
  is in, while backward goes on computing the earlier layers' gradients. Buckets are planned
  in the order backward fills them, and every rank launches them in that same order: gloo
  pairs the collectives of different ranks by the order they were issued.
* **The end of backward.** A callback queued on the autograd engine waits for every bucket,
  divides the sums by the world size and writes the means back into ``.grad``.
* **no_sync.** Inside ``with model.no_sync():`` the hooks do nothing, so gradients of several
  micro-batches accumulate in ``.grad``; the first backward outside reduces the sum at once.

What this file leaves out, and where the full wrapper (``ddp.wrapper.distributed``, whose
docstring gives the reading order from here) handles it: parameters that get no gradient in
some step (here a bucket would never launch), a first bucket plan that guesses the gradient
order wrong, mixed dtypes, communication hooks, uneven inputs, buffers such as BatchNorm's
running stats (broadcast at construction only).

Numerics: torch's DDP divides each gradient by the world size before the sum, this file after
it. At a world size that is a power of two the two are bitwise the same (scaling by 2**-k is
exact); at 3 ranks they can differ in the last bit. Where each gradient sits in its bucket
matters too: gloo's ring allreduce cuts a buffer into segments and starts each segment's sum at
a different rank, so an element's summation order depends on its position. The buckets here
are torch's construction-time plan, which torch keeps with ``find_unused_parameters=True``;
by default torch reduces its first step in one bucket and then rebuilds the buckets in the
order gradients arrived, which moves elements to other positions (``ddp.wrapper.reducer``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Variable

__all__ = ["DistributedDataParallel"]


class _Bucket:
    """Gradients that travel together: one flat buffer, a view of it per parameter."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        self.params = params
        self.flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype)
        self.views: dict[nn.Parameter, torch.Tensor] = {}
        offset = 0
        for p in params:
            self.views[p] = self.flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        self.waiting = len(params)  # gradients still to come in this backward
        self.work: dist.Work | None = None  # the allreduce in flight


class DistributedDataParallel(nn.Module):
    """Wrap ``module`` so that ``loss.backward()`` leaves the mean over ranks in every ``.grad``.

    ``bucket_cap_mb``: a bucket closes once it holds this many MB of gradients (torch's
    default: 25). Every parameter must require grad, share one dtype, and get a gradient in
    every synchronised backward.
    """

    def __init__(self, module: nn.Module, bucket_cap_mb: float = 25.0) -> None:
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        self.require_backward_grad_sync = True

        # Rule 1: every replica starts from rank 0's weights.
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor, src=0)

        # The buckets, planned as torch plans them at construction: walk the parameters in
        # the order the module registered them and close a bucket once it reaches the cap.
        # Then reverse the list: backward produces the last layer's gradients first, so the
        # bucket holding the last parameters is the first to fill, and the first to launch.
        cap_bytes = int(bucket_cap_mb * 2**20)
        planned: list[list[nn.Parameter]] = [[]]
        size = 0
        for p in module.parameters():
            planned[-1].append(p)
            size += p.numel() * p.element_size()
            if size >= cap_bytes:
                planned.append([])
                size = 0
        self.buckets = [_Bucket(params) for params in reversed(planned) if params]
        self.bucket_of = {p: b for b in self.buckets for p in b.params}

        # Rule 2 happens during backward. A hook per parameter: called once its .grad holds
        # this backward's gradient.
        for p in module.parameters():
            p.register_post_accumulate_grad_hook(self._gradient_ready)
        self.next_launch = 0  # buckets launch in plan order; this one is next
        self.callback_queued = False

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally: the hooks do nothing inside."""
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = True

    def _gradient_ready(self, p: nn.Parameter) -> None:
        if not self.require_backward_grad_sync:
            return  # .grad keeps what autograd accumulated
        if not self.callback_queued:
            # Runs once the whole backward is over, before loss.backward() returns.
            Variable._execution_engine.queue_callback(self._end_of_backward)
            self.callback_queued = True
        bucket = self.bucket_of[p]
        bucket.views[p].copy_(p.grad)  # what autograd accumulated, no_sync steps included
        bucket.waiting -= 1
        # Launch every full bucket whose turn it is. A later bucket that fills first waits
        # for the earlier ones: all ranks must issue the allreduces in the same order.
        while self.next_launch < len(self.buckets) and self.buckets[self.next_launch].waiting == 0:
            bucket = self.buckets[self.next_launch]
            bucket.work = dist.all_reduce(bucket.flat, async_op=True)  # returns at once
            self.next_launch += 1

    def _end_of_backward(self) -> None:
        if self.next_launch < len(self.buckets):
            missing = sum(bucket.waiting for bucket in self.buckets)
            raise RuntimeError(
                f"{missing} parameters got no gradient in this backward, so their bucket "
                "never launched and the other ranks wait for it; the full wrapper "
                "(ddp.DistributedDataParallel) handles this with find_unused_parameters=True"
            )
        for bucket in self.buckets:
            assert bucket.work is not None
            bucket.work.wait()  # the sum over ranks is in bucket.flat now
            bucket.flat.div_(self.world_size)
            for p in bucket.params:
                p.grad.copy_(bucket.views[p])
            bucket.waiting = len(bucket.params)
            bucket.work = None
        self.next_launch = 0
        self.callback_queued = False
