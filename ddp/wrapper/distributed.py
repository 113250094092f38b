"""``DistributedDataParallel``: a drop-in for ``torch.nn.parallel.DistributedDataParallel``.

Data parallelism in three moves: every replica starts from rank 0's weights (broadcast at
construction), every rank runs forward/backward on its own shard, and before the optimizer
steps every gradient is replaced by its mean over ranks (the reducer, during backward). Since
all ranks then apply the same update to the same weights, the replicas stay identical, and the
result equals one process training on the concatenated global batch.

The rest of torch's API lives beside it: ``ddp.wrapper.ddp_api`` (comm hooks, join, static graph,
logging data, pickling), ``ddp.wrapper.join``, ``ddp.wrapper.torch_args``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join, Joinable

from ddp.wrapper.buckets import torch_caps, torch_initial_plan
from ddp.wrapper.comm import broadcast_coalesced, verify_same_shapes
from ddp.wrapper.ddp_api import DDPApiMixin, dist_autograd_context, reached_params
from ddp.wrapper.join import agree_on_forward, sync_buffers_from
from ddp.wrapper.reducer import Reducer
from ddp.wrapper.reducer_support import Recorder
from ddp.wrapper.sink import hook_outputs
from ddp.wrapper.sparse import SparseGrads, split_sparse
from ddp.wrapper.torch_args import check_cpu_args, refuse_unsupported

__all__ = ["DistributedDataParallel"]


class DistributedDataParallel(DDPApiMixin, nn.Module, Joinable):
    """Wrap ``module`` so that ``loss.backward()`` leaves the across-rank mean in every ``.grad``.

    Takes torch's arguments, in torch's order. Implemented: ``broadcast_buffers``,
    ``init_sync``, ``process_group``, ``bucket_cap_mb``, ``find_unused_parameters``,
    ``gradient_as_bucket_view``, ``static_graph``, ``forward_sync_buffers``; accepted as the
    no-ops they are on CPU: ``device_ids=None``, ``output_device=None``, ``dim``,
    ``check_reduction``, ``batched_grad_copy`` (gradients are always copied in one batch); any
    other torch argument with a non-default value is refused, naming it (``torch_args``).

    Args:
        module: any ``nn.Module`` with at least one parameter that requires grad; the same
            architecture must be built on every rank.
        broadcast_buffers: broadcast buffers (e.g. BatchNorm running stats) from rank 0 at
            construction and at the start of each training forward, so replicas cannot drift
            through them. ``False`` skips both (torch 2.13's meaning).
        init_sync: check that every rank built the same model and broadcast rank 0's state.
        process_group: the group to average over (``None``: the default group).
        bucket_cap_mb: bucket size cap (default None: 25, with a 1 MB first bucket). Larger
            buckets mean fewer allreduce calls (each pays a latency floor); smaller ones start
            communicating earlier. ``0``: one allreduce per parameter tensor, the naive
            baseline. As in torch, the first iteration runs with one bucket (unless
            ``find_unused_parameters``) and the buckets are rebuilt by these caps in the order
            gradients arrived (``ddp.wrapper.bucket_rebuild``).
        find_unused_parameters: walk the autograd graph after each forward to find parameters
            this rank did not use; they contribute zeros. Costs a graph walk per forward.
        gradient_as_bucket_view: make ``.grad`` a view into the flat buckets, saving one
            gradient-sized copy and its memory.
        static_graph: the graph is the same every iteration (see ``ddp.wrapper.static_graph``).
        forward_sync_buffers: torch 2.13's successor of ``broadcast_buffers`` for the forward
            broadcast only (buffers are then always synced at construction).
        overlap: start each bucket's allreduce as soon as it fills, during backward; with
            ``False`` every bucket is reduced after backward (to measure what overlap buys).
            Not part of torch's API.
        flight_recorder: optional ``ddp.flight.recorder.FlightRecorder`` that sees every
            collective the wrapper issues, so a hang can be traced to the rank that never
            arrived; not part of torch's API. Set ``.reducer.step`` to label records by step.
    """

    def __init__(
        self,
        module: nn.Module,
        device_ids: Sequence[Any] | None = None,
        output_device: Any = None,
        dim: int = 0,
        broadcast_buffers: bool | None = None,
        init_sync: bool = True,
        process_group: dist.ProcessGroup | None = None,
        bucket_cap_mb: float | None = None,
        find_unused_parameters: bool = False,
        check_reduction: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
        *,
        overlap: bool = True,
        flight_recorder: Recorder | None = None,
        batched_grad_copy: bool = False,
        forward_sync_buffers: bool | None = None,
        **torch_only: Any,
    ) -> None:
        super().__init__()
        Joinable.__init__(self)
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "DistributedDataParallel needs an initialized process group: call "
                "torch.distributed.init_process_group('gloo', ...) first (or launch with "
                "python -m ddp / torchrun)."
            )
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
        if bucket_cap_mb is not None and not bucket_cap_mb >= 0:  # also rejects NaN
            raise ValueError(f"bucket_cap_mb must be >= 0, got {bucket_cap_mb}")
        refuse_unsupported(torch_only)
        if not any(p.requires_grad for p in module.parameters()):
            raise RuntimeError(
                "DistributedDataParallel is not needed when a module doesn't have any parameter "
                "that requires a gradient."
            )
        check_cpu_args(list(module.parameters()), device_ids, output_device, check_reduction)
        self.module = module
        self.device_ids, self.output_device, self.dim = None, None, dim
        self.device = next(p for p in module.parameters() if p.requires_grad).device
        self.process_group = process_group
        self.bucket_cap_mb = 25.0 if bucket_cap_mb is None else bucket_cap_mb
        self._bucket_caps = torch_caps(bucket_cap_mb)
        self._static_at_init = static_graph
        self.find_unused_parameters = find_unused_parameters
        # torch 2.13: broadcast_buffers (default True) governs construction and forward;
        # forward_sync_buffers, when given, governs the forward and construction always syncs.
        broadcast = True if broadcast_buffers is None else broadcast_buffers
        if forward_sync_buffers is None:
            self.forward_sync_buffers, init_sync_buffers = broadcast, broadcast
        else:
            self.forward_sync_buffers, init_sync_buffers = forward_sync_buffers, True
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.require_backward_grad_sync = True
        self.overlap = overlap
        self.static_graph = False
        self._divide_by_initial_world_size = True
        self._comm_hooks: list[tuple[Any, object]] = []

        self.flight_recorder = flight_recorder
        self._buffers_to_sync = list(module.buffers())
        if init_sync:
            with self._recorded("verify_shapes", step=-1):
                verify_same_shapes(
                    list(module.named_parameters()) + list(module.named_buffers()), process_group
                )
            # Not on the hot path: one coalesced broadcast per dtype makes every replica start
            # from rank 0's weights, frozen parameters included.
            states = list(module.parameters())
            if init_sync_buffers:
                states += self._buffers_to_sync
            with self._recorded("broadcast", step=-1):
                broadcast_coalesced(states, process_group)
        self._build_reducer()
        if static_graph:
            self._set_static_graph()

    @property
    def broadcast_buffers(self) -> bool:
        """Whether training forwards broadcast buffers (torch's property name)."""
        return self.forward_sync_buffers

    @broadcast_buffers.setter
    def broadcast_buffers(self, value: bool) -> None:
        self.forward_sync_buffers = value

    def _build_reducer(self) -> None:
        """The reducer and its hooks: at construction, and again after unpickling."""
        named = [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]
        every = [p for _, p in named]
        # Sparse-gradient parameters stay out of the dense buckets (ddp.wrapper.sparse).
        named, sparse = split_sparse(self.module, named)
        params = [p for _, p in named]
        one_bucket = self._static_at_init or not self.find_unused_parameters
        plan = torch_initial_plan(params, self._bucket_caps, one_bucket=one_bucket)
        self._param_index = {p: i for i, p in enumerate(params)}
        sparse_grads = SparseGrads(
            [p for _, p in sparse], [n for n, _ in sparse], self.process_group, len(plan)
        )
        self.reducer = Reducer(
            params,
            [n for n, _ in named],
            plan,
            self.process_group,
            caps=self._bucket_caps,
            overlap=self.overlap,
            gradient_as_bucket_view=self.gradient_as_bucket_view,
            find_unused_parameters=self.find_unused_parameters,
            recorder=self.flight_recorder,
            sparse=sparse_grads,
        )
        self._init_logging(every, params)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        sync = torch.is_grad_enabled() and self.require_backward_grad_sync
        if sync:
            self._logging.on_forward(self.reducer)
        # Only training forwards sync buffers: an eval pass that only rank 0 runs must not
        # start a collective the other ranks never join.
        bcast = bool(
            self.forward_sync_buffers
            and self._buffers_to_sync
            and self.training
            and torch.is_grad_enabled()
        )
        work = None
        if self._join_config.enable:
            work = Join.notify_join_context(self)
            _, _, src = agree_on_forward(
                self, sync_backward=sync, broadcast_buffers=bcast, joined=False
            )
            if bcast:
                sync_buffers_from(self, src)
        elif bcast:
            sync_buffers_from(self, 0)
        if sync:
            self._rebuild_buckets()
        out = self.module(*args, **kwargs)
        if sync:
            unused: list[int] = []
            if self.find_unused_parameters and not self.static_graph:
                reached = reached_params(out)
                unused = [i for p, i in self._param_index.items() if p not in reached]
            active = None
            if work is not None:
                # Join's notify: an allreduce of 1 per rank still training (Work.result() is
                # deprecated; the future carries the same tensor).
                active = round(work.get_future().wait()[0].item())
            self.reducer.prepare_for_backward(
                unused,
                active_ranks=active,
                divide_by_initial_world_size=self._divide_by_initial_world_size,
                dist_autograd_context=dist_autograd_context(),
            )
            # The end-of-backward callback is queued from the outputs' gradient (see
            # ddp.wrapper.sink), so nested backwards (reentrant checkpointing) cannot end it early.
            hook_outputs(out, self.reducer.output_hook)
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
    def bucket_shapes(self) -> list[list[list[int]]]:
        """Per bucket, in launch order, the shapes of its parameters in buffer order."""
        return self.reducer.bucket_shapes

    @property
    def last_comm_wait_s(self) -> float:
        """Seconds the last synchronised backward spent blocked waiting for allreduces."""
        return self.reducer.last_comm_wait_s
