"""``DistributedDataParallel``: a drop-in for ``torch.nn.parallel.DistributedDataParallel``.

Data parallelism in three moves: every replica starts from rank 0's weights (broadcast at
construction), every rank runs forward/backward on its own shard, and before the optimizer
steps every gradient is replaced by its mean over ranks (the reducer, during backward). Since
all ranks then apply the same update to the same weights, the replicas stay identical, and the
result equals one process training on the concatenated global batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ddp.buckets import plan_buckets
from ddp.comm import broadcast_coalesced, verify_same_shapes
from ddp.reducer import Reducer, _Recorder

__all__ = ["DistributedDataParallel"]


def _tensors_in(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensors_in(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors_in(item)


def _reached_params(outputs: Any) -> set[torch.Tensor]:
    """Parameters reachable from ``outputs`` through the autograd graph (leaves that would
    receive a gradient if backward ran from every output)."""
    reached: set[torch.Tensor] = set()
    stack = []
    for t in _tensors_in(outputs):
        if t.grad_fn is not None:
            stack.append(t.grad_fn)
        elif t.requires_grad:  # the output is a leaf parameter itself
            reached.add(t)
    seen = set()
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        var = getattr(fn, "variable", None)  # AccumulateGrad nodes hold their leaf
        if var is not None:
            reached.add(var)
        stack.extend(nxt for nxt, _ in fn.next_functions if nxt is not None)
    return reached


class DistributedDataParallel(nn.Module):
    """Wrap ``module`` so that ``loss.backward()`` leaves the across-rank mean in every ``.grad``.

    Args:
        module: any ``nn.Module``; the same architecture must be built on every rank.
        process_group: the group to average over (``None``: the default group).
        bucket_cap_mb: bucket size cap. Larger buckets mean fewer allreduce calls (each pays a
            latency floor); smaller ones start communicating earlier. ``0``: one allreduce per
            parameter tensor, the naive baseline.
        overlap: start each bucket's allreduce as soon as it fills, during backward; with
            ``False`` every bucket is reduced after backward (to measure what overlap buys).
        find_unused_parameters: walk the autograd graph after each forward to find parameters
            this rank did not use; they contribute zeros. Costs a graph walk per forward.
        broadcast_buffers: broadcast buffers (e.g. BatchNorm running stats) from rank 0 at the
            start of each training forward, so replicas cannot drift through them.
        gradient_as_bucket_view: make ``.grad`` a view into the flat buckets, saving one
            gradient-sized copy and its memory.
        flight_recorder: optional ``ddp.flight_recorder.FlightRecorder`` that sees every
            collective the wrapper issues, so a hang can be traced to the rank that never
            arrived; not part of torch's API. Set ``.reducer.step`` to label records by step.
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        process_group: dist.ProcessGroup | None = None,
        bucket_cap_mb: float = 25.0,
        overlap: bool = True,
        find_unused_parameters: bool = False,
        broadcast_buffers: bool = True,
        gradient_as_bucket_view: bool = False,
        flight_recorder: _Recorder | None = None,
    ) -> None:
        super().__init__()
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "DistributedDataParallel needs an initialized process group: call "
                "torch.distributed.init_process_group('gloo', ...) first (or launch with "
                "python -m ddp / torchrun)."
            )
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
        if not bucket_cap_mb >= 0:  # also rejects NaN
            raise ValueError(f"bucket_cap_mb must be >= 0, got {bucket_cap_mb}")
        self.module = module
        self.process_group = process_group
        self.bucket_cap_mb = bucket_cap_mb
        self.find_unused_parameters = find_unused_parameters
        self.broadcast_buffers = broadcast_buffers
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.require_backward_grad_sync = True

        self.flight_recorder = flight_recorder
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self._buffers_to_sync = [b for b in module.buffers()]
        with self._recorded("verify_shapes", step=-1):
            verify_same_shapes(
                list(module.named_parameters()) + list(module.named_buffers()), process_group
            )
        # Construction is not on the hot path: one coalesced broadcast per dtype makes every
        # replica start from rank 0's weights, frozen parameters included.
        with self._recorded("broadcast", step=-1):
            broadcast_coalesced(list(module.parameters()) + self._buffers_to_sync, process_group)

        params = [p for _, p in named]
        plan = plan_buckets(params, int(bucket_cap_mb * (1 << 20)))
        self._param_index = {p: i for i, p in enumerate(params)}
        self.reducer = Reducer(
            params,
            [n for n, _ in named],
            plan,
            process_group,
            overlap=overlap,
            gradient_as_bucket_view=gradient_as_bucket_view,
            find_unused_parameters=find_unused_parameters,
            recorder=flight_recorder,
        )

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        # Only training forwards sync buffers: an eval pass that only rank 0 runs must not
        # start a collective the other ranks never join.
        sync_buffers = self.broadcast_buffers and self._buffers_to_sync
        if sync_buffers and self.training and torch.is_grad_enabled():
            with self._recorded("broadcast_buffers", step=self.reducer.step):
                broadcast_coalesced(self._buffers_to_sync, self.process_group)
        out = self.module(*args, **kwargs)
        if torch.is_grad_enabled() and self.require_backward_grad_sync:
            unused: list[int] = []
            if self.find_unused_parameters:
                reached = _reached_params(out)
                unused = [i for p, i in self._param_index.items() if p not in reached]
            self.reducer.prepare_for_backward(unused)
        return out

    def _recorded(self, op: str, step: int) -> contextlib.AbstractContextManager:
        if self.flight_recorder is None:
            return contextlib.nullcontext()
        return self.flight_recorder.record(op, step=step)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally (no communication) for the backwards run inside.

        Gradient accumulation over K micro-batches needs one allreduce, not K: run K-1 of them
        under ``no_sync()`` and the last outside it, which reduces the accumulated sum.
        """
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    @property
    def num_buckets(self) -> int:
        """Allreduce calls per synchronised backward."""
        return self.reducer.num_buckets

    @property
    def last_comm_wait_s(self) -> float:
        """Seconds the last synchronised backward spent blocked waiting for allreduces."""
        return self.reducer.last_comm_wait_s
