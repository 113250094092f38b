"""Sharded optimizer state (ZeRO stage 1) on the wrapper's own buckets: ``ShardedOptimizer``.

DDP ends every backward with the mean gradient on every rank, and every rank then runs the same
optimizer step on the same numbers: N copies of the optimizer state (for Adam, two tensors the
size of the model) and N copies of the same arithmetic. ZeRO stage 1 keeps one copy, cut in N:

* **A shard.** Each bucket's flat gradient buffer is padded to a multiple of N and cut into N
  equal pieces; rank r owns piece r of every bucket. The cut follows the buckets, not whole
  parameters: a parameter may straddle two ranks, and every rank owns the same number of
  elements (whole-parameter partitions, as torch's ``ZeroRedundancyOptimizer`` makes, are as
  uneven as the parameters).
* **Reduce-scatter** instead of allreduce, bucket by bucket while backward runs: rank r ends
  with the mean of piece r only. gloo's ``reduce_scatter_tensor`` is an allreduce followed by
  a slice (torch 2.13's ``ProcessGroupGloo``): the bytes of a whole allreduce. So it is built
  here from gloo's ``all_to_all_single``: rank r sends piece j of its buffer to rank j and
  receives piece r of everyone's, then sums the N pieces it received, in rank order. Each rank
  sends (N-1)/N of the bucket, what the reduce-scatter half of a ring allreduce sends.
* **The step** runs on the shard only: a plain ``torch.optim`` optimizer (``.optim``) over one
  flat tensor per bucket, so its state (momentum, Adam's two moments) is 1/N of DDP's.
  Elementwise optimizers (SGD, Adam) compute on a flat piece what they compute per parameter.
* **All-gather** of the updated pieces (gloo's ring allgather: (N-1)/N of the bucket again), and
  every rank copies the gathered buffers into its parameters. Each element was computed by
  one rank and copied by all, so the replicas are bitwise identical.

Reduce-scatter plus all-gather send 2(N-1)/N of the model per rank per step: what one ring
allreduce sends (it is a reduce-scatter followed by an all-gather). torch's
``ZeroRedundancyOptimizer`` beside DDP keeps DDP's allreduce and broadcasts every partition
after the step: (N-1)/N more.

What it costs the wrapper: the buckets are fixed once this is built (they are the optimizer
state's layout; moving state between layouts would be a collective of the whole state), so the
one rebuild torch's DDP makes after its first backward is made at construction, in reverse
registration order (the order backward produces a model's gradients when its layers run in
the order they are registered). ``.grad`` is released once a synchronised backward copied it
into its bucket (under ``no_sync()`` it accumulates as usual): the mean exists only for the
shard, inside the optimizer, and keeping this rank's own gradient would cost a model's worth
of memory, which is what sharding is for. The all-gather lands in the buckets' gradient
buffers, free once their reduce-scatter ended, so receiving costs no second copy of the
model either. ``join()`` (a joined rank
would have to step its shard and gather), comm hooks, ``find_unused_parameters``,
``static_graph``, ``gradient_as_bucket_view`` and sparse gradients are refused.

Checkpoints: ``consolidate_state_dict(to)`` then ``state_dict()`` on rank ``to`` gives a plain
optimizer's ``state_dict`` over ``module.parameters()`` (torch's ``ZeroRedundancyOptimizer``
names), which loads into the unsharded optimizer, or into ``load_state_dict`` of a sharded one
at any world size.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ddp.wrapper.distributed import DistributedDataParallel

__all__ = ["ShardedOptimizer"]


class _Bucket:
    """One bucket's shard: the reducer's flat buffer for it (the gradients during backward, the
    all-gathered parameters after the step) and its parameter views, this rank's piece of the
    parameters (what the optimizer steps, its ``.grad`` the piece's mean gradient), and while a
    reduce-scatter runs the buffer that receives it.

    Memory, with P the model's bytes: the parameters and the flat buffers (P each), the shard,
    its gradient and the optimizer state (P/N each for Adam's two moments), and a bucket's
    receive buffer while its reduce-scatter runs. ``.grad`` is released once copied into its
    bucket. Unsharded DDP holds 5P with Adam (parameters, ``.grad``, buffers, two moments)."""

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        flat: torch.Tensor,
        views: list[torch.Tensor],
        world: int,
        rank: int,
    ) -> None:
        self.params = params
        self.flat, self.views = flat, views
        assert flat.numel() % world == 0, "the reducer pads sharded buckets to the world size"
        self.size = flat.numel() // world  # elements per rank
        self.offsets = [v.storage_offset() - flat.storage_offset() for v in views]
        self.received: torch.Tensor | None = None  # only while its reduce-scatter runs
        # The pieces of parameters this rank's shard covers: (parameter, its first element
        # here, the shard's position of it, how many).
        lo, hi = rank * self.size, (rank + 1) * self.size
        self.pieces = []
        for p, off in zip(params, self.offsets, strict=True):
            start, end = max(lo, off), min(hi, off + p.numel())
            if start < end:
                self.pieces.append((p, start - off, start - lo, end - start))
        self.shard = torch.zeros(self.size, dtype=params[0].dtype, device=params[0].device)
        self.shard.grad = torch.zeros_like(self.shard)
        self.take_params()
        self.reduced = False
        self.gather: dist.Work | None = None

    @torch.no_grad()
    def take_params(self) -> None:
        """The shard from the parameters as they are now (they may have been loaded or set
        since the last step): the optimizer steps the model's values, not a stale copy."""
        for p, first, at, n in self.pieces:
            self.shard[at : at + n].copy_(p.detach().reshape(-1)[first : first + n])


class ShardedOptimizer:
    """ZeRO stage 1 beside our ``DistributedDataParallel``: each rank keeps and steps 1/N of
    the optimizer state (see the module docstring).

    ``optimizer_class(params, **defaults)`` builds the optimizer each rank runs on its shard
    (``torch.optim.SGD``, ``torch.optim.Adam``: optimizers that treat elements independently);
    it is ``.optim``, and ``.state`` and ``.param_groups`` are its own. Build it after the
    wrapper and before the first backward; use it as an optimizer: ``zero_grad()``, backward,
    ``step()``. ``overlap_all_gather``: ``step()`` returns once the all-gathers are launched,
    and the wrapper's next forward (or ``wait()``) waits for them, so they run while the
    program does whatever it does between step and forward; off, ``step()`` returns with the
    parameters updated.
    """

    def __init__(
        self,
        model: DistributedDataParallel,
        optimizer_class: type[torch.optim.Optimizer],
        *,
        overlap_all_gather: bool = False,
        **defaults: Any,
    ) -> None:
        if not isinstance(model, DistributedDataParallel):
            raise TypeError(
                "ShardedOptimizer shards the buckets of ddp.DistributedDataParallel; for "
                "torch's DDP use torch.distributed.optim.ZeroRedundancyOptimizer"
            )
        self.model = model
        self._pg = model.process_group
        self.world = dist.get_world_size(self._pg)
        self.rank = dist.get_rank(self._pg)
        self.overlap_all_gather = overlap_all_gather
        reducer = model.reducer
        if reducer.rebuild_pending:  # the buckets are fixed from here on (module docstring)
            order = model.bucket_order or list(reversed(range(len(reducer.params))))
            model.restore_bucket_order(order)
        params = reducer.params
        buffers = reducer.shard_gradients(self)
        self._buckets = [
            _Bucket([params[i] for i in spec.indices], flat, views, self.world, self.rank)
            for spec, (flat, views) in zip(reducer.plan, buffers, strict=True)
        ]
        every = list(model.module.parameters())
        position = {id(p): k for k, p in enumerate(every)}
        self._index = [[position[id(p)] for p in b.params] for b in self._buckets]
        self._num_module_params = len(every)
        self.optim = optimizer_class([b.shard for b in self._buckets], **defaults)
        self._consolidated: dict[str, Any] | None = None
        self._handle = model.register_forward_pre_hook(self._before_forward)

    # ---- what the reducer calls, bucket by bucket ----------------------------------------------

    def reduce_scatter(self, b: int, flat: torch.Tensor) -> dist.Work:
        """Bucket b's gradients are in ``flat`` (each already divided by N): piece j goes to
        rank j, and piece ``rank`` of every rank's arrives in ``received``."""
        bucket = self._buckets[b]
        bucket.received = torch.empty_like(flat)
        work = dist.all_to_all_single(bucket.received, flat, group=self._pg, async_op=True)
        # Summed on gloo's thread as soon as the pieces land, so a receive buffer lives only
        # while its bucket is in flight, not until the end of backward.
        return work.get_future().then(lambda fut: self._sum(b, fut))

    @torch.no_grad()
    def _sum(self, b: int, fut: torch.futures.Future) -> None:
        fut.value()  # a failed all-to-all fails the bucket
        bucket = self._buckets[b]
        assert bucket.received is not None, "the sum follows its reduce_scatter()"
        pieces = bucket.received.view(self.world, bucket.size)
        torch.sum(pieces, dim=0, out=bucket.shard.grad)
        bucket.received = None

    def reduced(self, b: int) -> None:
        """Bucket b's reduce-scatter was waited for: the shard's mean gradient is in place."""
        bucket = self._buckets[b]
        assert bucket.received is None, "the sum ran before the wait returned"
        bucket.reduced = True

    # ---- the optimizer ----------------------------------------------------------------------

    @property
    def state(self) -> Any:
        return self.optim.state

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optim.param_groups

    @property
    def defaults(self) -> dict[str, Any]:
        return self.optim.defaults

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The parameters' ``.grad`` (this rank's own gradients), as ``Optimizer.zero_grad``;
        the shards' mean gradients are overwritten by the next synchronised backward."""
        for p in self.model.reducer.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_().zero_()

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """Step this rank's shard, then all-gather every bucket's updated parameters (waited
        for here, or with ``overlap_all_gather`` by the next forward or ``wait()``)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.wait()
        if not all(b.reduced for b in self._buckets):
            raise RuntimeError(
                "ShardedOptimizer.step() needs a synchronised backward since the last step "
                "(outside no_sync()): only it leaves the shard's mean gradient"
            )
        for b in self._buckets:
            b.take_params()
        self.optim.step()
        # The first layers' bucket is the last to fill in backward and the first forward needs.
        for b in reversed(self._buckets):
            b.reduced = False
            # Into the bucket's gradient buffer: its gradients were reduce-scattered, and the
            # next synchronised backward overwrites it only after the forward that waits.
            b.gather = dist.all_gather_single(b.flat, b.shard, group=self._pg, async_op=True)
        if not self.overlap_all_gather:
            self.wait()
        return loss

    @torch.no_grad()
    def wait(self) -> None:
        """Wait for the all-gathers of the last step and copy the parameters out of them."""
        for b in reversed(self._buckets):
            if b.gather is None:
                continue
            b.gather.wait()
            b.gather = None
            torch._foreach_copy_(b.params, b.views)

    def _before_forward(self, _module: Any, _args: Any) -> None:
        self.wait()

    # ---- the whole state, for checkpoints and the single-process reference --------------------

    @torch.no_grad()
    def consolidate_state_dict(self, to: int = 0) -> None:
        """A collective: rank ``to`` receives every rank's shard of the state and keeps the
        whole as a plain optimizer's ``state_dict`` (``state_dict()`` returns it there)."""
        self.wait()
        mine = self.optim.state_dict()["state"]
        whole: dict[int, dict[str, Any]] = {}
        for b, bucket in enumerate(self._buckets):
            state = mine.get(b, {})
            per_param: list[dict[str, Any]] = [{} for _ in bucket.params]
            for key in sorted(state):
                value = state[key]
                if not _is_piece(value, bucket):  # e.g. Adam's step: the same on every rank
                    for d in per_param:
                        d[key] = value.clone() if isinstance(value, torch.Tensor) else value
                    continue
                if self.rank != to:  # only the receiver holds the whole: the others send
                    dist.gather(value, None, group=self._pg, group_dst=to)
                    continue
                pieces = [torch.empty_like(value) for _ in range(self.world)]
                dist.gather(value, pieces, group=self._pg, group_dst=to)
                flat = torch.cat(pieces)
                for d, p, off in zip(per_param, bucket.params, bucket.offsets, strict=True):
                    d[key] = flat[off : off + p.numel()].view_as(p).clone()
            for k, d in zip(self._index[b], per_param, strict=True):
                if d:
                    whole[k] = d
        self._consolidated = None
        if self.rank == to:
            group = {k: v for k, v in self.optim.param_groups[0].items() if k != "params"}
            group["params"] = list(range(self._num_module_params))
            self._consolidated = {"state": whole, "param_groups": [group]}

    def state_dict(self) -> dict[str, Any]:
        """The whole state, on the rank ``consolidate_state_dict`` sent it to (torch's
        ``ZeroRedundancyOptimizer`` contract)."""
        if self._consolidated is None:
            raise RuntimeError(
                "ShardedOptimizer.state_dict() is the whole state: call "
                "consolidate_state_dict(to=this rank) on every rank first"
            )
        return self._consolidated

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a whole (plain optimizer's, over ``module.parameters()``) ``state_dict``; every
        rank keeps its shard of it, and the group settings."""
        whole = state_dict["state"]
        if len(state_dict["param_groups"]) != 1:
            raise ValueError("ShardedOptimizer loads a state_dict of one parameter group")
        mine: dict[int, dict[str, Any]] = {}
        for b, bucket in enumerate(self._buckets):
            states = [whole.get(k, whole.get(str(k))) for k in self._index[b]]
            if all(s is None for s in states):
                continue
            if any(s is None for s in states):
                raise ValueError("a bucket's parameters must all have optimizer state, or none")
            shard: dict[str, Any] = {}
            lo = self.rank * bucket.size
            for key, first in states[0].items():
                if not (isinstance(first, torch.Tensor) and first.dim() > 0):
                    shard[key] = first.clone() if isinstance(first, torch.Tensor) else first
                    continue
                flat = torch.zeros(bucket.flat.numel(), dtype=first.dtype)
                for s, p, off in zip(states, bucket.params, bucket.offsets, strict=True):
                    flat[off : off + p.numel()].copy_(s[key].reshape(-1))
                shard[key] = flat[lo : lo + bucket.size].clone()
            mine[b] = shard
        group = dict(state_dict["param_groups"][0])
        group["params"] = list(range(len(self._buckets)))
        self.optim.load_state_dict({"state": mine, "param_groups": [group]})

    def __repr__(self) -> str:
        return (
            f"ShardedOptimizer({type(self.optim).__name__}, rank {self.rank} of {self.world}, "
            f"{sum(b.size for b in self._buckets)} elements in {len(self._buckets)} bucket shards)"
        )


def _is_piece(value: Any, bucket: _Bucket) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() == 1 and value.numel() == bucket.size
