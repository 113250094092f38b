"""``DistributedDataParallel``: a drop-in for ``torch.nn.parallel.DistributedDataParallel``.

Reading order. Start at ``ddp/lesson.py``: the whole idea in under 200 lines (rank 0's weights
broadcast at construction, a hook per parameter, buckets launched as they fill while backward
goes on, the mean written back at the end of backward, ``no_sync``). This class does the same
with torch's whole API; the longer work behind its methods is in the files below, in the order
worth reading them, each with what it adds and why torch's DDP needs it:

1. ``reducer``: the lesson's hooks and buckets as one state machine that survives what real
   models do. Its hooks sit on the gradient accumulators, so they also fire under
   ``torch.distributed.autograd``; the end-of-backward callback is queued from the outputs, so
   a nested backward (reentrant activation checkpointing) cannot end it early; each bucket
   carries, per parameter, the number of ranks that gave it no gradient, so a parameter
   missing on one rank is an error on every rank rather than a hang; the plan is rebuilt once
   in the order gradients really arrived, since a model whose layers run in another order than
   they were registered would otherwise launch nothing before backward ends;
   ``gradient_as_bucket_view`` makes ``.grad`` a view of the bucket (one copy less).
2. ``buckets``: torch's plan, a pure function every rank computes alike: the first iteration
   in one bucket (registration order may not be backward's order), a 1 MB first bucket at the
   default cap so communication starts early, one dtype per bucket.
3. ``autograd_graph``: ``find_unused_parameters``. A walk of the graph after forward finds
   the parameters this rank will get no gradient for; they contribute zeros, so a model that
   skips a layer on some steps or ranks does not leave a bucket waiting forever.
4. ``static_graph``: a graph declared the same every step needs no walk, and may deliver a
   parameter's gradient several times per backward (reentrant checkpointing).
5. ``join``: uneven inputs. A rank that ran out of batches shadows the collectives of those
   still training, so they do not hang, and all end with the same model.
6. ``grad_bucket``, ``comm_hooks``, ``hook_names``, ``hierarchical`` and ``topology``:
   communication hooks, torch's contract for replacing the averaging allreduce without
   touching the reducer: compression (fp16, bf16, PowerSGD) and a two-level allreduce for
   ranks on several nodes.
7. ``sparse``: embeddings with sparse gradients, reduced as sparse tensors after the dense
   buckets (in a dense bucket a few touched rows would travel as the whole table).
8. ``logging_data``: ``_get_ddp_logging_data()`` with torch's keys and sampled timings, for
   tools written against torch's DDP.
9. ``auto_cap`` and ``auto_tune``: ``bucket_cap_mb='auto'`` (not torch's): time the link at
   the rebuild and choose the cap from a cost model. ``comm_plan``, ``cross_node``, ``replan``
   and ``comm_auto``: ``comm='auto'``, the cap and the algorithm chosen together, and chosen
   again when the link changes.
10. ``comm`` and ``torch_args``: construction: a check that every rank built the same model,
    the coalesced broadcast, the flight recorder's records, and torch's argument checks.
11. ``zero``: after DDP, ``ShardedOptimizer`` (ZeRO stage 1): the buckets reduce-scattered
    instead of allreduced, each rank stepping 1/N of the optimizer state, the parameters
    all-gathered; the same bytes as the allreduce.

Numerics: gloo's ring allreduce sums each segment of a flat buffer starting at a different
rank, so an element's summation order depends on its position and on the buffer's length. The
counts in each bucket's tail (1.) lengthen the buffer, so without a communication hook the
results equal torch's up to the order of float sums; with one (the counts then travel apart)
every bucket is torch's, element for element (``tests/ddp/test_lesson.py`` holds the lesson,
this class with torch's ``allreduce_hook`` and torch's DDP bitwise equal).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join, Joinable, JoinHook

from ddp.wrapper.auto_tune import AutoCap, tune, wants_auto
from ddp.wrapper.autograd_graph import dist_autograd_context, unreached
from ddp.wrapper.buckets import torch_caps, torch_initial_plan
from ddp.wrapper.comm import Recorder, recorded, sync_replicas
from ddp.wrapper.comm_auto import AutoComm
from ddp.wrapper.grad_bucket import check_hook_annotations
from ddp.wrapper.join import DDPJoinHook, before_forward, final_state, ranks_training
from ddp.wrapper.logging_data import DDPLoggingData
from ddp.wrapper.reducer import _SHARDED_JOIN, Reducer
from ddp.wrapper.sparse import SparseGrads, split_sparse
from ddp.wrapper.static_graph import may_set_static_graph, warn_find_unused_with_static_graph
from ddp.wrapper.torch_args import buffer_sync, check_arguments

__all__ = ["DistributedDataParallel"]

# Rebuilt by ``_build_reducer`` on load; the flight recorder (threads, files) stays behind.
_NOT_PICKLED = ("reducer", "_logging", "flight_recorder")


class DistributedDataParallel(nn.Module, Joinable):
    """Wrap ``module`` so that ``loss.backward()`` leaves the across-rank mean in every ``.grad``.

    Takes torch's arguments, in torch's order. ``device_ids=None``, ``output_device=None``,
    ``dim``, ``check_reduction`` and ``batched_grad_copy`` are accepted as the no-ops they are on
    CPU; any other torch argument not listed below is refused unless left at its default, naming
    it (``torch_args``).

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
            communicating earlier; ``0``: one allreduce per parameter tensor. As in torch, the
            first iteration runs with one bucket (unless ``find_unused_parameters``), then the
            buckets are rebuilt in the order gradients arrived (``reducer``). ``'auto'``
            (not torch's): at that rebuild, time the link and choose the cap (``auto_tune``).
        find_unused_parameters: walk the autograd graph after each forward to find parameters
            this rank did not use; they contribute zeros.
        gradient_as_bucket_view: make ``.grad`` a view into the flat buckets (one copy less).
        static_graph: the graph is the same every iteration (see ``static_graph``).
        forward_sync_buffers: torch 2.13's successor of ``broadcast_buffers`` for the forward
            broadcast only (buffers are then always synced at construction).
        comm (not torch's): ``'default'`` (torch's allreduce) or ``'auto'``: choose the bucket
            cap and the exact allreduce algorithm (flat ring, or two levels whose cross-node
            exchange is a ring, a direct exchange or recursive doubling) from measurements at
            the rebuild, check them against the steps, re-plan when the link changes
            (``comm_auto``). Registers its own comm hook; needs the default group, the default
            ``bucket_cap_mb`` and no ``find_unused_parameters``.
        overlap (not torch's): start each bucket's allreduce as soon as it fills, during
            backward; ``False`` reduces every bucket after backward (to measure overlap).
        flight_recorder (not torch's): a ``ddp.flight.recorder.FlightRecorder`` that sees every
            collective, so a hang can be traced to the rank that never arrived. Set
            ``.reducer.step`` to label records by step.
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
        bucket_cap_mb: float | str | None = None,
        find_unused_parameters: bool = False,
        check_reduction: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
        *,
        comm: str = "default",
        overlap: bool = True,
        flight_recorder: Recorder | None = None,
        batched_grad_copy: bool = False,
        forward_sync_buffers: bool | None = None,
        **torch_only: Any,
    ) -> None:
        super().__init__()
        Joinable.__init__(self)
        _check_comm(comm, bucket_cap_mb, find_unused_parameters, process_group)
        self._tune_cap, bucket_cap_mb = wants_auto(bucket_cap_mb, find_unused_parameters)
        self.auto_cap: AutoCap | None = None  # what 'auto' chose, once it has
        check_arguments(
            module,
            bucket_cap_mb,
            torch_only,
            device_ids,
            output_device,
            check_reduction,
            group_given=process_group is not None,
        )
        self.module, self.process_group = module, process_group
        self.device_ids, self.output_device, self.dim = None, None, dim
        self.device = next(p for p in module.parameters() if p.requires_grad).device
        self.bucket_cap_mb = 25.0 if bucket_cap_mb is None else bucket_cap_mb
        self._bucket_caps = torch_caps(bucket_cap_mb)
        self.bucket_bytes_cap_default = bucket_cap_mb is None
        self._static_at_init = static_graph
        self.find_unused_parameters = find_unused_parameters
        self.forward_sync_buffers, init_sync_buffers = buffer_sync(
            broadcast_buffers, forward_sync_buffers
        )
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.require_backward_grad_sync = True
        self.overlap, self.static_graph = overlap, False
        self._divide_by_initial_world_size = True
        self._comm_hooks: list[tuple[Any, object]] = []
        self.flight_recorder = flight_recorder
        self._buffers_to_sync = list(module.buffers())
        if init_sync:
            buffers = self._buffers_to_sync if init_sync_buffers else []
            sync_replicas(module, buffers, process_group, flight_recorder)
        self._build_reducer()
        if static_graph:
            self._set_static_graph()
        self.auto_comm: AutoComm | None = None
        if comm == "auto":  # a collective: every rank learns the layout, builds the groups
            self.auto_comm = AutoComm(self, dist.get_world_size())

    @property
    def bucket_bytes_cap(self) -> int:
        """Every bucket's cap but the first, in bytes (torch's attribute; with
        ``bucket_bytes_cap_default`` it is what a comm hook's owner reads of the layout, as
        live recovery's Manager does to lay out its allreduces)."""
        return self._bucket_caps[1]

    @property
    def broadcast_buffers(self) -> bool:
        """Whether training forwards broadcast buffers (torch's property name)."""
        return self.forward_sync_buffers

    @broadcast_buffers.setter
    def broadcast_buffers(self, value: bool) -> None:
        self.forward_sync_buffers = value

    def _build_reducer(self) -> None:
        """The reducer, its hooks and the logging data: at construction and after unpickling.

        The reducer averages the parameters that require grad, sparse-gradient ones apart
        (``sparse``), in registration order, bucketed by torch's construction-time plan
        (``buckets``). The logging data counts every parameter that requires grad, so it maps
        the reducer's indices to those (torch's indices in ``rebuilt_per_bucket_param_indices``
        and the ready order)."""
        named = [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]
        every = [p for _, p in named]
        named, sparse = split_sparse(self.module, named)
        params = [p for _, p in named]
        one_bucket = self._static_at_init or not self.find_unused_parameters
        plan = torch_initial_plan(params, self._bucket_caps, one_bucket=one_bucket)
        self._param_index = {p: i for i, p in enumerate(params)}
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
            sparse=SparseGrads(
                [p for _, p in sparse], [n for n, _ in sparse], self.process_group, len(plan)
            ),
        )
        settings = {
            "bucket_cap_bytes": int(self.bucket_cap_mb * (1 << 20)),
            "find_unused_parameters": int(self.find_unused_parameters),
            "gradient_as_bucket_view": int(self.gradient_as_bucket_view),
            "broadcast_buffers": int(self.forward_sync_buffers),
        }
        sizes = self.reducer.bucket_sizes
        self._logging = DDPLoggingData(self.module, every, sizes, self.process_group, settings)
        position = {id(p): k for k, p in enumerate(every)}
        self._logging.param_index = [position[id(p)] for p in params]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        grad = torch.is_grad_enabled()
        sync = grad and self.require_backward_grad_sync
        if sync:
            self._logging.on_forward(self.reducer)
        # Only training forwards sync buffers: an eval pass that only rank 0 runs must not
        # start a collective the other ranks never join.
        bcast = bool(self.forward_sync_buffers and self._buffers_to_sync and self.training and grad)
        group, buffers = self.process_group, self._buffers_to_sync
        notify = before_forward(self, group, self.reducer, buffers, sync=sync, bcast=bcast)
        if sync:
            self._rebuild_buckets()
        out = self.module(*args, **kwargs)
        if sync:
            walk = self.find_unused_parameters and not self.static_graph
            unused = unreached(out, self._param_index) if walk else []
            self.reducer.prepare_for_backward(
                unused,
                active_ranks=ranks_training(notify),
                divide_by_initial_world_size=self._divide_by_initial_world_size,
                dist_autograd_context=dist_autograd_context(),
            )
            # The end-of-backward callback is queued from the outputs' gradient (see
            # ddp.wrapper.reducer), so nested backwards (reentrant checkpointing) cannot end it
            # early.
            self.reducer.hook_outputs(out)
        return out

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally (no communication) for the backwards run inside: of K
        micro-batches, run K-1 under ``no_sync()`` and the last outside it, which reduces the
        accumulated sum (one allreduce, not K)."""
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    def register_comm_hook(self, state: object, hook: Callable) -> None:
        """Let ``hook(state, bucket)`` communicate each gradient bucket instead of the built-in
        averaging allreduce (torch's contract), for compression (fp16, bf16, PowerSGD) and other
        aggregation schemes without touching the reducer. ``bucket.buffer()`` holds this rank's
        *unaveraged* gradients (``grad_bucket``); the hook returns a ``torch.futures.Future`` of
        the bucket's new contents. Once, and not between a forward and its backward."""
        if not callable(hook):
            raise TypeError("Communication hook must be callable.")
        check_hook_annotations(hook)
        self.reducer.register_comm_hook(state, hook)
        self._comm_hooks.append((hook, state))
        self._logging.data["comm_hook"] = getattr(hook, "__qualname__", repr(hook))

    def join(
        self,
        divide_by_initial_world_size: bool = True,
        enable: bool = True,
        throw_on_early_termination: bool = False,
    ) -> Join:
        """Context manager for ranks with different numbers of batches (see ``ddp.wrapper.join``):
        a rank that runs out shadows the others' collectives until all have joined, then all
        take the last joiner's model. ``divide_by_initial_world_size=False`` averages over the
        ranks still training; ``throw_on_early_termination`` raises on every rank instead."""
        divide = divide_by_initial_world_size
        return Join([self], enable, throw_on_early_termination, divide_by_initial_world_size=divide)

    def join_hook(self, **kwargs: Any) -> JoinHook:
        """The ``Joinable`` protocol: the hook ``Join`` runs on this rank once it has joined."""
        if self.reducer.sharded:
            raise RuntimeError(_SHARDED_JOIN)
        self._divide_by_initial_world_size = kwargs.get("divide_by_initial_world_size", True)
        self._logging.data["join_uneven_inputs"] = 1
        return DDPJoinHook(
            self.reducer,
            self.process_group,
            self._buffers_to_sync,
            rebuild_buckets=self._rebuild_buckets,
            final_state=lambda: final_state(self.module, self.broadcast_buffers),
        )

    @property
    def join_device(self) -> torch.device:
        return self.device

    @property
    def join_process_group(self) -> Any:
        return self.process_group if self.process_group is not None else dist.group.WORLD

    def _set_static_graph(self) -> None:
        """Declare the graph static (what ``static_graph=True`` does; see ``static_graph``).
        Only before training starts, as in torch."""
        started = self._logging.iterations > 0 or self.reducer._expect_backward
        if not may_set_static_graph(self.static_graph, started, self._logging.log_error):
            return
        self.static_graph = True
        self.reducer.static.enable()
        self._logging.data["static_graph"] = 1
        if self.find_unused_parameters:
            warn_find_unused_with_static_graph()

    def _rebuild_buckets(self) -> bool:
        """torch's ``reducer._rebuild_buckets()``: once, before a synchronised forward, the
        buckets are re-planned in the order gradients arrived (see ``reducer``), with
        the cap ``bucket_cap_mb='auto'`` chose then (``auto_tune``)."""
        if getattr(self, "auto_comm", None) is not None:
            return self._auto_comm_step()
        if not self.reducer.rebuild_due():
            return False
        if self._tune_cap:
            self.auto_cap = tune(self.reducer, self.process_group, self._logging)
            self.bucket_cap_mb = self.auto_cap.cap_mb
        caps = torch_caps(self.bucket_cap_mb) if self._tune_cap else None
        with recorded(self.flight_recorder, "rebuild_buckets", step=self.reducer.step):
            self.reducer.rebuild_buckets(caps)
        self._logging.on_rebuild(self.reducer)
        return True

    def _auto_comm_step(self) -> bool:
        """``comm='auto'``: the planner's turn before a synchronised forward; the buckets are
        rebuilt (the first plan) or laid out anew (a later one with another cap)."""
        assert self.auto_comm is not None
        due = self.reducer.rebuild_due()
        cap = self.auto_comm.before_forward(self.reducer, self._logging)
        if cap is None or not (due or cap != self.bucket_cap_mb):
            return False
        with recorded(self.flight_recorder, "rebuild_buckets", step=self.reducer.step):
            if due:
                self.reducer.rebuild_buckets(torch_caps(cap))
            else:
                self.reducer.replan(torch_caps(cap))
        self.bucket_cap_mb = cap
        self._logging.on_rebuild(self.reducer)
        return True

    @property
    def bucket_order(self) -> list[int] | None:
        """Not torch's API: the parameter order the buckets are (about to be) rebuilt in, for a
        checkpoint (``reducer``); resume with ``restore_bucket_order``."""
        return self.reducer.bucket_order

    def restore_bucket_order(self, order: list[int]) -> None:
        """Not torch's API: rebuild the buckets in a checkpoint's ``bucket_order`` before the
        first forward of a resumed run, so every step has the buckets it had before. Every
        rank calls it (a broadcast; rank 0's order wins)."""
        with recorded(self.flight_recorder, "restore_bucket_order", self.reducer.step):
            self.reducer.restore_bucket_order(order)
        self._logging.on_rebuild(self.reducer)

    def _get_ddp_logging_data(self) -> dict[str, str | int]:
        """torch's logging data: settings, bucket sizes, hook, join and sampled timings (ns)."""
        return dict(self._logging.data)

    def _set_ddp_runtime_logging_sample_rate(self, sample_rate: int) -> None:
        """Record timings every ``sample_rate`` iterations after the first 10 (default 100)."""
        self._logging.set_sample_rate(sample_rate)

    def __getstate__(self) -> dict[str, Any]:
        """The wrapper without what does not survive pickling (the reducer's autograd hooks,
        the logging data built with it, the flight recorder), rebuilt by ``__setstate__`` as
        torch does, so the loaded wrapper averages again. torch's error for a wrapper of a
        non-default group, whose group cannot be pickled either."""
        group = self.process_group
        if group is not None and group != dist.group.WORLD:
            raise RuntimeError(
                "DDP Pickling/Unpickling are only supported when using DDP with the default "
                "process group. That is, when you have called init_process_group and have not "
                "passed process_group argument to DDP constructor"
            )
        state = copy.copy(self.__dict__)
        for key in _NOT_PICKLED:
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # type: ignore[misc]
        self.process_group = self.flight_recorder = None
        hooks, static = self._comm_hooks, self.static_graph
        self._comm_hooks, self.static_graph = [], False
        self._build_reducer()
        if static:
            self._set_static_graph()
        for hook, hook_state in hooks:
            self.register_comm_hook(hook_state, hook)

    @property
    def num_buckets(self) -> int:
        """Allreduce calls per synchronised backward."""
        return self.reducer.num_buckets


def _check_comm(
    comm: str, bucket_cap_mb: float | str | None, find_unused: bool, group: object
) -> None:
    if comm not in ("default", "auto"):
        raise ValueError(f"comm must be 'default' or 'auto', got {comm!r}")
    if comm != "auto":
        return
    if bucket_cap_mb is not None:
        raise ValueError("comm='auto' chooses the bucket cap itself: leave bucket_cap_mb unset")
    if find_unused:
        raise ValueError(
            "comm='auto' plans when the buckets are rebuilt, which find_unused_parameters=True "
            "never does (torch's rule)"
        )
    if group is not None and group is not dist.group.WORLD:
        raise ValueError("comm='auto' runs on the default (world) process group")
