"""The reducer: turns per-parameter "gradient ready" events into bucketed allreduces.

This file is the whole state machine (torch's ``reducer.cpp``). Read it in this order:

**What a bucket is** (``BucketBuffers``). The bucket plan (``ddp.wrapper.buckets``, a pure
function of the parameters) says which gradients travel together; here each bucket becomes one
flat buffer, and each parameter a view into it, shaped like the parameter. Beside the
gradients, each bucket carries one "no gradient here" count per parameter: in the buffer's
tail, so the same allreduce sums gradients and counts; or, once a communication hook owns the
buffer, in one separate small tensor the reducer allreduces itself when it needs the counts.

**When a bucket launches** (``Reducer``: ``prepare_for_backward``, ``_on_grad``,
``_mark_ready``, ``_launch_in_order``).

1. ``prepare_for_backward`` (end of forward) resets the iteration and marks the parameters
   known to be unused (``find_unused_parameters``' graph walk, or the set a static graph fixed
   in its first iteration) as ready with a zero contribution.
2. Backward fires a hook per parameter, on its gradient accumulator (the node torch's reducer
   hooks too: it also fires under ``torch.distributed.autograd``, where gradients go to a
   context, not ``.grad``). The hook copies the gradient, divided by the world size, into its
   slot. When a bucket's last slot is filled, and every earlier bucket has launched, its
   allreduce (or the comm hook) starts asynchronously while backward carries on: overlap.
   Buckets launch strictly in plan order on every rank, because gloo pairs collectives by the
   order they are issued, and gradients may become ready in another order on another rank.

**What happens at the end of backward** (``_finalize``). A callback queued on the autograd
engine runs once backward is over: it marks what backward never reached, launches what is
left, waits for every bucket, reads how many ranks missed each parameter, raises if one was
missed without ``find_unused_parameters``, and writes the averaged gradients back to ``.grad``.

The callback is queued from a gradient hook on the wrapper's outputs (``hook_outputs``; torch's
DDP uses a pass-through autograd function, ``_DDPSink``, for the same job). Backward reaches the
outputs before any parameter, and always in the graph task that ``loss.backward()`` started, so
the callback ends that backward even when parameters' gradients arrive inside nested
(reentrant) backwards, as reentrant activation checkpointing produces: a callback queued from a
parameter hook there would run at the end of the inner backward, before the outer one has
produced the remaining gradients. The parameter hooks still queue it if the outputs' hook never
runs (a backward that does not start from the outputs). A tensor hook rather than torch's
autograd function: no clone of the outputs and no extra graph node.

**Rebuilding the plan once** (``_Rebuild``, ``Reducer.rebuild_buckets``). The construction-time
plan guesses backward's order from registration order. A model whose layers are registered in
another order than they run (an embedding registered last but used first, a ``ModuleList``
applied in reverse) then fills its buckets out of plan order, an early bucket waits for a
gradient that comes last, and nothing overlaps. torch's reducer corrects the guess once: it
records the order gradients became ready in a synchronised backward and, before the next
training forward, recomputes the buckets in that order with the same caps. torch's rules:

* every rank takes rank 0's order (one broadcast): the plan must be identical everywhere, and
  each rank's order may differ (gradients race on the autograd engine's threads);
* not with ``find_unused_parameters`` (unless ``static_graph``): the used set may change every
  iteration, so no recorded order describes the next one;
* with ``static_graph`` the first backward reduces everything at its end (nothing is
  recorded), so the order comes from the second one, and the rebuild happens before the third
  forward;
* once per wrapper. Parameters that got no gradient in the recorded backward go last, in the
  default order.

Joined ranks (``join()``) count the backwards they shadow (``shadow_backward``) and join the
broadcast, so every rank rebuilds in the same forward and keeps issuing the same collectives.

Around this core, in files of their own: static graphs (``static_graph``), sparse gradients,
reduced after the dense buckets (``sparse``), what a comm hook sees of a bucket
(``grad_bucket``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.autograd import Variable

from ddp.wrapper.buckets import BucketSpec, plan_buckets
from ddp.wrapper.comm import Recorder
from ddp.wrapper.grad_bucket import GradBucket, hook_result
from ddp.wrapper.sparse import SparseGrads, unexpected_grad_message
from ddp.wrapper.static_graph import StaticGraph

__all__ = ["BucketBuffers", "Reducer"]

_SHARDED_JOIN = (
    "join() (uneven inputs) is not supported with ShardedOptimizer: a joined rank would also "
    "have to step its shard and take part in the all-gather; give every rank the same number "
    "of batches"
)


# ---- what a bucket is ----------------------------------------------------------------------


@dataclass
class BucketBuffers:
    """The reducer's memory for one plan. ``flats[b]``: what bucket b's collective (or hook)
    works on. ``views[i]``: parameter i's gradient slot, shaped like it. ``where[i]``: (bucket,
    slot). ``flags[b]``: bucket b's "no gradient here" counts, a view into ``flats[b]``'s tail
    (no hook: one allreduce sums gradients and counts together, so learning who missed a
    parameter is free) or into ``flag_store`` (a hook owns ``flats[b]``: it may compress,
    rescale or replace it, and must never see the counts)."""

    flats: list[torch.Tensor]
    views: list[torch.Tensor]
    where: list[tuple[int, int]]
    flags: list[torch.Tensor]
    flag_store: torch.Tensor | None  # only in the hook layout

    @classmethod
    def build(
        cls,
        params: Sequence[torch.Tensor],
        plan: Sequence[BucketSpec],
        *,
        counts_in_tail: bool,
        pad_to: int = 1,
    ) -> BucketBuffers:
        """``pad_to``: each gradient buffer's length is rounded up to a multiple of it (zeros
        after the last gradient), so a reduce-scatter cuts it into equal shards."""
        n = len(params)
        where: list[tuple[int, int]] = [(-1, -1)] * n
        views: list[torch.Tensor] = [torch.empty(0)] * n
        flats: list[torch.Tensor] = []
        flags: list[torch.Tensor] = []
        store = None
        if not counts_in_tail:
            total = sum(len(spec.indices) for spec in plan)
            device = plan[0].device if plan else torch.device("cpu")
            store = torch.zeros(total, dtype=torch.float32, device=device)
        start = 0
        for b, spec in enumerate(plan):
            tail = len(spec.indices) if counts_in_tail else 0
            padded = -(-spec.numel // pad_to) * pad_to
            flat = torch.zeros(padded + tail, dtype=spec.dtype, device=spec.device)
            offset = 0
            for slot, i in enumerate(spec.indices):
                p = params[i]
                where[i] = (b, slot)
                views[i] = flat[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
            flats.append(flat)
            if store is None:
                flags.append(flat[padded:])
            else:
                flags.append(store[start : start + len(spec.indices)])
                start += len(spec.indices)
        assert all(b >= 0 for b, _ in where), "every parameter must be in one bucket"
        return cls(flats, views, where, flags, store)

    @torch.no_grad()
    def adopt_grads(self, params: Sequence[torch.Tensor]) -> None:
        """gradient_as_bucket_view: make every existing ``.grad`` a view into these buffers,
        keeping its values (at construction, and whenever the layout changes)."""
        for p, view in zip(params, self.views, strict=True):
            if p.grad is not None:
                view.copy_(p.grad)
                p.grad = view


def _is_view_of(grad: torch.Tensor, view: torch.Tensor) -> bool:
    return grad.data_ptr() == view.data_ptr() and grad.shape == view.shape


# ---- the stamps and the rebuild, held by the reducer ----------------------------------------


class _Stamps:
    """perf_counter() stamps of the last synchronised backward: when it began and ended, each
    bucket's launch and completion, when communication ended, and when each gradient was ready
    (for timelines, DDP logging data and the auto cap)."""

    def __init__(self, num_buckets: int) -> None:
        self.new_plan(num_buckets)
        self.backward_start = 0.0
        self.backward_end = 0.0
        self.comm_end = 0.0
        self.ready: list[float] = []  # the running backward's, in ready order
        self.last_ready_s: list[float] = []  # the last finished one's, s after it began

    def new_plan(self, num_buckets: int) -> None:
        self.launch = [0.0] * num_buckets
        self.done = [0.0] * num_buckets

    def start_backward(self) -> None:
        self.backward_start = time.perf_counter()
        self.ready = []

    def end_backward(self) -> None:
        self.last_ready_s = [t - self.backward_start for t in self.ready]


class _Rebuild:
    """When the plan is rebuilt and in which order (the rules in the module docstring). Knows
    no buffers and no group: the reducer broadcasts the order and lays out the new plan."""

    def __init__(self, num_params: int, caps: tuple[int, int]) -> None:
        self.num_params = num_params
        self.caps = caps  # (first bucket's, the others'), as ddp.wrapper.buckets.torch_caps
        self.done = False
        self.order: list[int] = []  # the rebuilt plan's
        self.last_ready_order: list[int] = []  # the last finished synchronised backward's
        self.synced_backwards = 0  # finished or (joined) shadowed

    def count_backward(self, ready_order: Sequence[int]) -> None:
        self.last_ready_order = list(ready_order)
        self.synced_backwards += 1

    def pending(self, *, static: bool, find_unused: bool) -> bool:
        return not self.done and (static or not find_unused)

    def due(self, *, static: bool, find_unused: bool) -> bool:
        pending = self.pending(static=static, find_unused=find_unused)
        return pending and self.synced_backwards >= (2 if static else 1)

    def recorded_order(self) -> list[int]:
        """The last ready order, completed by the parameters it lacks, in the default order."""
        seen = set(self.last_ready_order)
        missing = [i for i in reversed(range(self.num_params)) if i not in seen]
        return self.last_ready_order + missing

    def plan(self, params: Sequence[torch.Tensor], order: Sequence[int]) -> list[BucketSpec]:
        """The new plan in ``order`` (rank 0's, once broadcast), by torch's close-at-cap rule."""
        self.order = list(order)
        self.done = True
        first, cap = self.caps
        return plan_buckets(params, cap, first, close_at_cap=True, order=self.order)


# ---- the state machine ----------------------------------------------------------------------


class Reducer:
    """Bucketed, optionally overlapped gradient averaging for a fixed list of parameters.

    The bucket plan must be identical on every rank (see ``buckets``; a rebuild reuses its
    ``caps``, the first bucket's and the others'): ranks launch bucket collectives strictly in
    plan order, which keeps gloo's pairing of collectives consistent even when gradients become
    ready in a different order on each rank.
    """

    # How the end of backward waits for each bucket's collective. Live recovery replaces it
    # with a wait that a peer's abort notice interrupts (ddp.recovery.protocol.waiting).
    wait_work: Callable[[Any], Any] = staticmethod(lambda work: work.wait())

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        names: Sequence[str],
        plan: Sequence[BucketSpec],
        process_group: dist.ProcessGroup | None,
        *,
        caps: tuple[int, int],
        overlap: bool,
        gradient_as_bucket_view: bool,
        find_unused_parameters: bool,
        recorder: Recorder | None = None,
        sparse: SparseGrads | None = None,
    ) -> None:
        self._params = list(params)  # dense ones; ``sparse`` holds the rest (ddp.wrapper.sparse)
        self._sparse = sparse
        self._names = list(names)
        self._plan = list(plan)
        self._pg = process_group
        # The group's own allreduce skips dist.all_reduce's Python checks (once per bucket).
        self._pg_obj = process_group if process_group is not None else dist.group.WORLD
        self._world = dist.get_world_size(process_group)
        self._overlap = overlap
        self._as_view = gradient_as_bucket_view
        self._find_unused = find_unused_parameters
        self.recorder = recorder
        self.step = -1  # label for the flight recorder; the training loop sets it
        self._hook: Callable | None = None
        self._hook_state: object = None
        self._shard: Any = None  # ddp.wrapper.zero.ShardedOptimizer, once gradients are sharded
        self.static = StaticGraph(len(self._params))
        self._div = self._world  # what each gradient is pre-divided by (join may lower it)
        self._dist_ctx: int | None = None  # torch.distributed.autograd context, if any
        self._incoming: dict[int, torch.Tensor] = {}  # its gradients, as the hooks saw them
        # Parameters this rank had no gradient for in the iteration running / last finished:
        # what a joined rank keeps contributing, as torch's reducer keeps its last used-map.
        self._local_missing: list[int] = []
        self.last_local_missing: list[int] = list(range(len(self._params)))
        self._bucket_params = [[self._params[i] for i in spec.indices] for spec in self._plan]
        # One rank, no hook: each gradient already is the mean, so nothing is copied in, sent
        # or copied back (the buckets still carry the missing-gradient flags for the checks).
        # With gradient_as_bucket_view the gradients live in the buckets anyway.
        self._local_only = self._world == 1 and not self._as_view
        self.output_hook = self._on_output_grad  # one bound method, not one per forward
        self._set_buffers(self._layout())
        if self._as_view:
            self._buf.adopt_grads(self._params)
        self._reset_iteration()
        self._stamps = _Stamps(len(self._plan))
        self._rebuild = _Rebuild(len(self._params), caps)
        self._ready_order: list[int] = []  # the running backward's, from the hooks only
        self.last_comm_wait_s = 0.0
        self.last_unused_bytes = 0
        self._expect_backward = False
        self._used_since_sync = [False] * len(self._params)
        self._stash: dict[int, torch.Tensor] = {}
        # Kept alive: a parameter holds its accumulator weakly; a new one would lack our hook.
        self._accumulators = [p.view_as(p).grad_fn.next_functions[0][0] for p in self._params]
        self._handles = [
            acc.register_hook(functools.partial(self._on_grad, i))
            for i, acc in enumerate(self._accumulators)
        ]

    def _layout(self, plan: Sequence[BucketSpec] | None = None) -> BucketBuffers:
        """Buffers for ``plan`` (default: the current one): counts in the tail unless a hook or
        the sharding owns the gradient buffers; padded to the world size when sharded."""
        own = self._hook is None and self._shard is None
        pad = self._world if self._shard is not None else 1
        return BucketBuffers.build(
            self._params, self._plan if plan is None else plan, counts_in_tail=own, pad_to=pad
        )

    def _set_buffers(self, buf: BucketBuffers) -> None:
        self._buf = buf
        self._flats, self._views, self._where = buf.flats, buf.views, buf.where
        self._flags = buf.flags

    def _reset_iteration(self) -> None:
        self._ready = [False] * len(self._params)
        self._pending = [len(spec.indices) for spec in self._plan]
        self._bucket_ready = [False] * len(self._plan)
        self._next_launch = 0
        self._works: list[dist.Work | torch.futures.Future | None] = [None] * len(self._plan)
        self._callback_queued = False

    # ---- end of forward: arm the iteration -----------------------------------------------------

    def prepare_for_backward(
        self,
        unused: Sequence[int] = (),
        *,
        active_ranks: int | None = None,
        divide_by_initial_world_size: bool = True,
        dist_autograd_context: int | None = None,
    ) -> None:
        """Arm the reducer for the backward of the forward that just ran.

        ``unused``: indices of parameters this rank's forward did not reach (only with
        ``find_unused_parameters``); they are marked ready at once with a zero contribution.
        ``active_ranks``: under ``join()``, how many ranks still have inputs (the joined ones
        contribute zero gradients); without ``divide_by_initial_world_size`` it is the divisor.
        ``dist_autograd_context``: the distributed-autograd context the backward will run in.
        """
        if self._expect_backward:
            raise RuntimeError(
                "the previous forward's gradients were never reduced: every forward run with "
                "gradient sync must be followed by a backward through its outputs before the "
                "next forward. Wrap forwards you do not backpropagate in torch.no_grad() or "
                "no_sync()."
            )
        self._reset_iteration()
        self.static.reset_iteration()
        self._ready_order = []
        for flags in self._flags:
            flags.zero_()
        self._local_missing = []
        if self._hook is None:
            use_active = active_ranks is not None and not divide_by_initial_world_size
            self._div = active_ranks if use_active else self._world
        self._dist_ctx = dist_autograd_context
        self._expect_backward = True
        self._stamps.start_backward()
        if self.static.enabled and not self.static.first_iteration:
            unused = self.static.unused
        with torch.no_grad():  # forward runs with grad mode on; the hooks below do not need it
            for i in unused:
                # A parameter that took part in an earlier no_sync micro-step holds an
                # accumulated gradient that must be reduced though this last forward skipped it.
                self._mark_ready(i, self._params[i].grad, missing=not self._used_since_sync[i])
            if all(self._ready) and not self._sparse:
                # No parameter is left for backward to reach (none at all, or this rank's
                # forward used none), so no hook will fire to queue the final callback: reduce
                # now, or the others would wait for our buckets forever. Not with sparse ones:
                # they exist only after backward, and the outputs' hook queues it then.
                self._finalize()

    def hook_outputs(self, outputs: Any) -> None:
        """Register the end-of-backward trigger on every tensor in ``outputs`` (nested lists,
        tuples, dicts) that has a grad_fn; tensors without one have no backward to start."""
        if isinstance(outputs, torch.Tensor):
            if outputs.grad_fn is not None:
                outputs.register_hook(self.output_hook)
        elif isinstance(outputs, (list, tuple)):
            for item in outputs:
                self.hook_outputs(item)
        elif isinstance(outputs, dict):
            for item in outputs.values():
                self.hook_outputs(item)

    # ---- during backward: a hook per parameter, buckets launched in order ----------------------

    def _on_output_grad(self, _grad: torch.Tensor) -> None:
        # Runs in the outermost graph task (see the module docstring), so the callback ends
        # the whole backward, not a checkpoint's inner one.
        if not self._callback_queued and self._expect_backward:
            Variable._execution_engine.queue_callback(self._finalize)
            self._callback_queued = True

    def _on_grad(self, i: int, _grad_inputs: object, grad_outputs: Sequence[torch.Tensor]) -> None:
        if not self._expect_backward:
            # Inside no_sync(): gradients accumulate in .grad; remember who took part.
            self._used_since_sync[i] = True
            return
        if not self._callback_queued:  # the outputs' hook did not run: queue it here
            Variable._execution_engine.queue_callback(self._finalize)
            self._callback_queued = True
        if self._dist_ctx is not None:  # the context, not .grad, holds the gradient
            prev = self._incoming.get(i)
            grad_in = grad_outputs[0]
            self._incoming[i] = grad_in if prev is None else prev + grad_in
        if self.static.enabled and not self.static.arrived(i, self._names[i]):
            return  # more arrivals of this gradient to come (or all of them, first iteration)
        if self._ready[i]:
            raise RuntimeError(
                f"parameter {self._names[i]!r} received a gradient twice in one synchronised "
                "backward (reentrant backward, e.g. reentrant activation checkpointing, or a "
                "backward through a graph that find_unused_parameters marked unused). Run one "
                "backward per forward, or construct with static_graph=True if the graph is the "
                "same every iteration."
            )
        self._ready_order.append(i)
        self._stamps.ready.append(time.perf_counter())
        grad = self._params[i].grad if self._dist_ctx is None else self._incoming[i]
        if torch.is_grad_enabled():  # backward(create_graph=True) runs hooks in grad mode
            with torch.no_grad():
                self._mark_ready(i, grad, missing=False)
        else:
            self._mark_ready(i, grad, missing=False)

    def _mark_ready(self, i: int, grad: torch.Tensor | None, *, missing: bool) -> None:
        # Called from backward hooks (grad mode is off there) or under no_grad: no decorator,
        # its per-call cost is paid once per parameter per step.
        view = self._views[i]
        b, slot = self._where[i]
        if missing:
            p = self._params[i]
            if grad is not None and self._as_view and _is_view_of(grad, view):
                # The slot is about to be overwritten; keep this rank's .grad intact in case
                # no rank used the parameter (then .grad must come back untouched).
                self._stash[i] = grad.clone()
                p.grad = self._stash[i]
            view.zero_()
            self._flags[b][slot] = 1
            self._local_missing.append(i)
        elif grad is None or grad.is_sparse:  # sparse: not an Embedding(sparse=True) weight
            raise RuntimeError(unexpected_grad_message(self._names[i], grad))
        elif self._local_only:
            pass
        elif self._as_view and _is_view_of(grad, view):
            # gradient_as_bucket_view: autograd accumulated straight into the bucket.
            # Pre-divide so the SUM-allreduce yields the mean (gloo has no AVG).
            if self._div != 1:
                view.div_(self._div)
        else:
            # torch's arithmetic: multiply by the reciprocal while copying in (one pass), so
            # results are bitwise torch's also where 1/world is inexact (e.g. 3 ranks).
            torch.mul(grad, 1.0 / self._div, out=view)
            if self._as_view and self._dist_ctx is None:
                self._params[i].grad = view
            elif self._shard is not None:  # the bucket holds it now (ddp.wrapper.zero)
                self._params[i].grad = None
        self._ready[i] = True
        self._pending[b] -= 1
        if self._pending[b] == 0:
            self._bucket_ready[b] = True
            if self._overlap and not self.static.first_iteration:
                self._launch_in_order()

    def _launch_in_order(self) -> None:
        # Bucket k+1 may fill before bucket k (different parameter order on this rank); it
        # still waits, because gloo pairs collectives by issue order across ranks.
        while self._next_launch < len(self._plan) and self._bucket_ready[self._next_launch]:
            b = self._next_launch
            if self._local_only:
                self._stamps.launch[b] = self._stamps.done[b] = time.perf_counter()
                self._next_launch += 1
                continue
            self._works[b] = self._start_bucket(b)
            self._next_launch += 1

    def _start_bucket(self, b: int) -> dist.Work | torch.futures.Future:
        """Launch bucket b's allreduce (or hand it to the comm hook), stamped and recorded."""
        flat = self._flats[b]
        seq = None
        op = "allreduce" if self._hook is None else "comm_hook"
        if self._shard is not None:
            op = "reduce_scatter"
        if self.recorder is not None:
            nbytes = flat.numel() * flat.element_size()
            seq = self.recorder.start(op, step=self.step, bucket=b, nbytes=nbytes)
        self._stamps.launch[b] = time.perf_counter()
        if self._shard is not None:
            work = self._shard.reduce_scatter(b, flat)
        elif self._hook is None:
            work = self._pg_obj.allreduce([flat])
        else:
            last = b == len(self._plan) - 1
            work = self._hook(self._hook_state, GradBucket(b, flat, last, self._bucket_params[b]))
        if self.recorder is not None:
            # Runs on gloo's thread when the collective really finishes (not when we get around
            # to waiting), so the timeline shows how much of it hid behind backward. It needs
            # the GIL on that thread, which can delay the next bucket by a little, so only
            # instrumented runs pay for it.
            fut = work.get_future() if hasattr(work, "get_future") else work  # Work or Future
            fut.add_done_callback(functools.partial(self._on_done, b, seq))
        return work

    def _on_done(self, b: int, seq: int | None, fut: torch.futures.Future) -> None:
        self._stamps.done[b] = time.perf_counter()
        if seq is None or self.recorder is None:
            return
        try:
            fut.value()
        except Exception as e:  # the error itself surfaces to the caller through wait()
            self.recorder.fail(seq, str(e))
        else:
            self.recorder.complete(seq)

    # ---- end of backward: wait, check, write back ----------------------------------------------

    def _finalize(self) -> None:
        self._stamps.backward_end = time.perf_counter()
        self._expect_backward = False
        with torch.no_grad():
            for i, ready in enumerate(self._ready):
                if not ready:
                    # Never reached by backward (or, in a static graph's first iteration, held
                    # back until now). Its slot still has to travel with the bucket, or the
                    # other ranks would wait for this bucket forever.
                    arrived = self.static.first_iteration and self.static.fired(i)
                    grad = self._params[i].grad if self._dist_ctx is None else self._incoming.get(i)
                    self._mark_ready(i, grad, missing=not (arrived or self._used_since_sync[i]))
        self._launch_in_order()
        assert self._next_launch == len(self._plan), "every bucket launched exactly once"
        self._wait_all()
        if self._sparse:  # after every dense bucket, before any error: the same order everywhere
            self._sparse.reduce(self._div, self._hook, self._hook_state, self._dist_ctx)
        missed, local_only = self._missing_counts()
        if missed and not (self._find_unused or self.static.enabled):
            raise RuntimeError(self._unused_message(missed, local_only))
        skip = {i for i, c in missed.items() if c == self._world}  # unused on every rank
        if self.static.enabled:
            skip = self.static.end_iteration(skip)
        self._write_back(skip)
        self.last_local_missing = self._local_missing
        self._stash.clear()
        self._incoming.clear()
        self._used_since_sync = [False] * len(self._params)
        self._stamps.end_backward()
        self._rebuild.count_backward(self._ready_order)

    def _needs_global_counts(self) -> bool:
        return self._find_unused or self.static.first_iteration

    def _wait_all(self) -> None:
        t0 = time.perf_counter()
        stamps = self._stamps
        for b, work in enumerate(self._works):
            if work is None:
                assert self._local_only, "every bucket launched a collective"
                continue
            value = self.wait_work(work)
            if self._shard is not None:
                self._shard.reduced(b)
            if self._hook is not None:
                flat = self._flats[b]
                result = hook_result(value, b, flat.numel())
                if result.data_ptr() != flat.data_ptr():  # e.g. a decompressed copy
                    flat.copy_(result.view_as(flat))
            if stamps.done[b] < stamps.launch[b]:  # no completion callback (yet): now
                stamps.done[b] = time.perf_counter()
        if self._hook is not None and self._needs_global_counts():
            # Only after every hook's future is done: a hook may issue follow-up collectives
            # from its callbacks (PowerSGD does), and issuing ours in between on one rank but
            # not another would pair mismatched collectives across ranks.
            assert self._buf.flag_store is not None
            dist.all_reduce(self._buf.flag_store, group=self._pg)
        stamps.comm_end = time.perf_counter()
        self.last_comm_wait_s = stamps.comm_end - t0
        # Drop the finished works: a Work kept alive into interpreter shutdown can be
        # destroyed from gloo's thread after Python is gone.
        self._works = [None] * len(self._plan)

    def _missing_counts(self) -> tuple[dict[int, int], bool]:
        """Parameter index -> number of ranks that had no gradient for it (only nonzero ones),
        and whether those are this rank's own counts only (a hook is registered and nothing
        needed the global ones)."""
        out: dict[int, int] = {}
        unused_bytes = 0
        for spec, flags in zip(self._plan, self._flags, strict=True):
            if bool(flags.any()):
                for slot, count in enumerate(flags.tolist()):
                    if count:
                        out[spec.indices[slot]] = round(count)
        for i in out:
            p = self._params[i]
            unused_bytes += p.numel() * p.element_size()
        self.last_unused_bytes = unused_bytes
        return out, self._hook is not None and not self._needs_global_counts()

    @torch.no_grad()
    def _write_back(self, skip: set[int]) -> None:
        if self._local_only:  # the gradients never left .grad (or the context)
            return
        if self._shard is not None:  # only the shard's mean exists, and the optimizer has it
            return
        if self._dist_ctx is not None:
            self._write_back_dist_autograd(skip)
            return
        if self._as_view:
            for i, (p, view) in enumerate(zip(self._params, self._views, strict=True)):
                if i not in skip:
                    p.grad = view
            return
        copy_dst, copy_src = [], []
        for i, (p, view) in enumerate(zip(self._params, self._views, strict=True)):
            if i in skip:
                continue
            if p.grad is None:
                p.grad = view.clone()
            else:
                copy_dst.append(p.grad)
                copy_src.append(view)
        if copy_dst:
            torch._foreach_copy_(copy_dst, copy_src)

    def _write_back_dist_autograd(self, skip: set[int]) -> None:
        # The context's gradient tensors are the ones DistributedOptimizer and get_gradients()
        # read, so they are updated in place; .grad is not this backward's business.
        import torch.distributed.autograd as dist_autograd

        grads = dist_autograd.get_gradients(self._dist_ctx)
        for i, (p, view) in enumerate(zip(self._params, self._views, strict=True)):
            g = grads.get(p)
            if i not in skip and g is not None:
                g.copy_(view)

    def _unused_message(self, missed: dict[int, int], local_only: bool) -> str:
        if local_only:
            names = [f"{self._names[i]} (on this rank)" for i in missed]
        else:
            names = [f"{self._names[i]} (on {c} of {self._world} ranks)" for i, c in missed.items()]
        return (
            "these parameters received no gradient in this backward, so their allreduce would "
            f"have been incomplete: {', '.join(names)}. If some parameters are legitimately "
            "unused in some forward passes, construct DistributedDataParallel with "
            "find_unused_parameters=True; otherwise make sure the loss depends on every "
            "parameter that requires grad (or set requires_grad=False on it)."
        )

    # ---- between iterations: the rebuild ------------------------------------------------------

    @property
    def has_rebuilt_buckets(self) -> bool:
        return self._rebuild.done

    @property
    def rebuild_pending(self) -> bool:
        """Whether a rebuild is still to come (it never comes with find_unused_parameters)."""
        return self._rebuild.pending(static=self.static.enabled, find_unused=self._find_unused)

    @property
    def synced_backwards(self) -> int:
        """Synchronised backwards finished or (joined) shadowed: the same count on every rank,
        so a schedule keyed on it issues its collectives at the same step everywhere."""
        return self._rebuild.synced_backwards

    def rebuild_due(self) -> bool:
        """Whether the next synchronised forward rebuilds (the same answer on every rank)."""
        return self._rebuild.due(static=self.static.enabled, find_unused=self._find_unused)

    def rebuild_buckets(self, caps: tuple[int, int] | None = None) -> bool:
        """Before a synchronised forward (or a joined rank's shadow of one): if due, replace
        the plan by one in rank 0's recorded ready order, with new ``caps`` if given (the auto
        cap's). True if it rebuilt. A collective: all ranks call it in the same iteration (they
        count the same synchronised backwards)."""
        if not self.rebuild_due():
            return False
        if caps is not None:
            self._rebuild.caps = caps
        assert not self._expect_backward, "rebuilt between iterations only"
        self._rebuild_in(self._rebuild.recorded_order())
        return True

    @property
    def bucket_order(self) -> list[int] | None:
        """The order the plan of the next iteration is built in: the rebuilt one, or the one
        the rebuild due before the next forward will take (None: the construction plan
        stays). What a checkpoint keeps, so a resumed run has an uninterrupted run's buckets
        at every step: with 3 or more ranks the layout decides gloo's summation order, so
        bitwise resumption needs the same buckets."""
        if self._rebuild.done:
            return list(self._rebuild.order)
        return self._rebuild.recorded_order() if self.rebuild_due() else None

    def replan(self, caps: tuple[int, int]) -> None:
        """Lay the buckets out anew with ``caps``, in the order the rebuild took (not torch's:
        ``comm='auto'`` re-plans when it learns more or the link changes). Between iterations,
        on every rank with the same caps; no collective (the order is already shared)."""
        assert self._rebuild.done and not self._expect_backward, "after the rebuild, between steps"
        self._rebuild.caps = caps
        self._adopt_plan(self._rebuild.plan(self._params, self._rebuild.order))

    def restore_bucket_order(self, order: Sequence[int]) -> None:
        """Rebuild in a checkpoint's ``bucket_order`` now (before the first forward), as the
        run that wrote it had. A collective, like the rebuild: rank 0's order wins."""
        assert not self._expect_backward, "rebuilt between iterations only"
        self._rebuild_in(order)

    def _rebuild_in(self, order: Sequence[int]) -> None:
        t = torch.tensor(order, dtype=torch.int64)
        if t.numel() != len(self._params):
            raise ValueError(f"bucket order of {t.numel()} parameters for {len(self._params)}")
        self.wait_work(dist.broadcast(t, group=self._pg, group_src=0, async_op=True))
        self._adopt_plan(self._rebuild.plan(self._params, t.tolist()))

    @torch.no_grad()
    def _adopt_plan(self, plan: Sequence[BucketSpec]) -> None:
        if self._shard is not None:  # the shards are the optimizer state's layout
            raise RuntimeError(
                "the buckets of a sharded wrapper are fixed once ShardedOptimizer is built: "
                "rebuild or restore the bucket order before building it"
            )
        self._plan = list(plan)
        self._bucket_params = [[self._params[i] for i in spec.indices] for spec in self._plan]
        layout = self._layout()
        self._set_buffers(layout)
        if self._as_view:  # torch too moves every .grad into the new buckets, keeping values
            layout.adopt_grads(self._params)
        self._stamps.new_plan(len(self._plan))
        if self._sparse:
            self._sparse.first_index = len(self._plan)
        self._reset_iteration()

    # ---- comm hooks and join -------------------------------------------------------------------

    def register_comm_hook(self, state: object, hook: Callable) -> None:
        """Route every bucket through ``hook(state, GradBucket)`` instead of the averaging
        allreduce; the flat buffers switch to the gradients-only layout."""
        if self._hook is not None:
            raise RuntimeError(
                "register_comm_hook or register_builtin_comm_hook can only be called once."
            )
        if self._expect_backward:
            raise RuntimeError(
                "register_comm_hook was called between a forward and its backward; register the "
                "hook before the training loop (or between iterations)"
            )
        if self._shard is not None:
            raise RuntimeError(
                "the gradients are sharded (ddp.wrapper.ShardedOptimizer reduce-scatters each "
                "bucket): a comm hook would have to reduce-scatter instead; use one or the other"
            )
        old = self._views
        self._set_buffers(BucketBuffers.build(self._params, self._plan, counts_in_tail=False))
        if self._as_view:
            with torch.no_grad():
                for p, view, prev in zip(self._params, self._views, old, strict=True):
                    if p.grad is not None and _is_view_of(p.grad, prev):
                        view.copy_(prev)
                        p.grad = view
        self._hook, self._hook_state = hook, state
        self._div = 1
        self._local_only = False  # the hook runs at any world size

    @property
    def has_comm_hook(self) -> bool:
        return self._hook is not None

    def shard_gradients(self, shard: Any) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
        """ZeRO-1 (``ddp.wrapper.zero``): from now on each bucket is padded to a multiple of the
        world size and handed to ``shard.reduce_scatter(b, flat)`` when it is ready, instead of
        the allreduce; after its wait, ``shard.reduced(b)``. A synchronised backward releases
        ``.grad`` once its bucket holds it: only the shard's mean exists, and only the shard's
        optimizer reads it. Returns every bucket's flat buffer and its parameters' views into
        it, in plan order: the sharding reuses them between a reduce-scatter and the next
        backward."""
        if self._shard is not None:
            raise RuntimeError("the gradients are already sharded: one ShardedOptimizer per model")
        refused = [
            ("a comm hook", self._hook is not None),
            ("find_unused_parameters=True", self._find_unused),
            ("static_graph=True", self.static.enabled),
            ("gradient_as_bucket_view=True", self._as_view),
            ("sparse gradients", bool(self._sparse)),
        ]
        bad = [what for what, hit in refused if hit]
        if bad:
            raise ValueError(
                f"ShardedOptimizer cannot shard a wrapper with {', '.join(bad)}: every rank "
                "steps every element of its shard each step, and the buckets are reduce-"
                "scattered by the sharding itself; construct the wrapper without it"
            )
        if self._expect_backward:
            raise RuntimeError("shard the gradients between iterations, not inside one")
        self._shard = shard
        self._local_only = False
        self._set_buffers(self._layout())
        return [
            (flat, [self._views[i] for i in spec.indices])
            for flat, spec in zip(self._flats, self._plan, strict=True)
        ]

    @property
    def sharded(self) -> bool:
        return self._shard is not None

    def shadow_backward(self) -> None:
        """The collectives of one synchronised backward with zero gradients, for a rank that
        has run out of inputs under ``join()`` while others still train. With unused-parameter
        detection it keeps reporting the parameters it missed in its own last iteration (all,
        if it never trained), as torch's joined reducer keeps contributing its last used-map:
        so the others' counts, and which .grad they leave untouched, match torch's."""
        if self._shard is not None:
            raise RuntimeError(_SHARDED_JOIN)
        shadow = BucketBuffers.build(self._params, self._plan, counts_in_tail=self._hook is None)
        if self._needs_global_counts():
            for i in self.last_local_missing:
                b, slot = shadow.where[i]
                shadow.flags[b][slot] = 1
        if self._hook is None:
            works = [dist.all_reduce(z, group=self._pg, async_op=True) for z in shadow.flats]
        else:
            last = len(shadow.flats) - 1
            works = [
                self._hook(self._hook_state, GradBucket(b, z, b == last, self._bucket_params[b]))
                for b, z in enumerate(shadow.flats)
            ]
        for work in works:
            work.wait()
        if self._hook is not None and self._needs_global_counts():
            assert shadow.flag_store is not None
            dist.all_reduce(shadow.flag_store, group=self._pg)
        if self._sparse:  # last, as in _finalize
            self._sparse.shadow(self._hook, self._hook_state)
        # No order of its own: rank 0's (or the default) rules the rebuild.
        self._stamps.ready = []
        self._stamps.end_backward()
        self._rebuild.count_backward([])

    def remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    # ---- what the reducer reports --------------------------------------------------------------

    @property
    def params(self) -> list[torch.nn.Parameter]:
        """The parameters the buckets hold, in the order the plan's indices refer to."""
        return list(self._params)

    @property
    def num_buckets(self) -> int:
        return len(self._plan)

    @property
    def plan(self) -> list[BucketSpec]:
        """The buckets, in launch order (after a rebuild, the rebuilt ones)."""
        return list(self._plan)

    @property
    def bucket_sizes(self) -> list[int]:
        """Gradient bytes per bucket, in launch order."""
        return [spec.nbytes for spec in self._plan]

    @property
    def bucket_shapes(self) -> list[list[list[int]]]:
        """Per bucket, in launch order, its parameters' shapes in buffer order."""
        return [[list(self._params[i].shape) for i in spec.indices] for spec in self._plan]

    @property
    def last_ready_order(self) -> list[int]:
        """The order gradients became ready in the last synchronised backward (hooks only)."""
        return self._rebuild.last_ready_order

    def ready_profile(self) -> list[tuple[float, int]]:
        """(seconds after backward began, bytes) of each gradient of the last synchronised
        backward, in ready order: what ``bucket_cap_mb='auto'`` plans with."""
        params = [self._params[i] for i in self._rebuild.last_ready_order]
        sizes = [p.numel() * p.element_size() for p in params]
        return list(zip(self._stamps.last_ready_s, sizes, strict=True))

    @property
    def last_timeline(self) -> dict[str, object]:
        """perf_counter() stamps of the last synchronised backward: when it ended, and each
        bucket's (launch, completion) in launch order. Completion is when the allreduce really
        finished if a flight recorder is attached, else when ``wait()`` returned."""
        return {
            "backward_end": self._stamps.backward_end,
            "buckets": list(zip(self._stamps.launch, self._stamps.done, strict=True)),
        }

    @property
    def last_stamps(self) -> dict[str, float]:
        """perf_counter() stamps of the last synchronised backward, for DDP logging data."""
        s = self._stamps
        return {
            "backward_compute_start": s.backward_start,
            "backward_compute_end": s.backward_end,
            "backward_comm_start": min(s.launch, default=0.0),
            "backward_comm_end": s.comm_end,
        }
