"""The reducer: turns per-parameter "gradient ready" events into bucketed allreduces.

1. ``prepare_for_backward`` (end of forward) resets the per-iteration state and marks the
   parameters known to be unused (``find_unused_parameters``' graph walk, or the set a static
   graph fixed in its first iteration) as ready with a zero contribution.
2. Backward fires a hook per parameter, on its gradient accumulator (the node torch's reducer
   hooks too: it also fires under ``torch.distributed.autograd``, where gradients go to a
   context, not ``.grad``). The hook copies the gradient into its slot of the bucket's flat
   buffer; when a bucket is full, and every earlier one launched, its allreduce (or the comm
   hook) starts asynchronously while backward carries on.
3. A callback queued on the autograd engine runs when backward finishes: it launches what is
   left, waits for every bucket, checks which parameters got no gradient anywhere, and writes
   the averaged gradients back.

Who missed a parameter, and the layout with a hook: ``ddp.wrapper.bucket_buffers``. Static graphs:
``static_graph``. Sparse gradients, reduced after the dense buckets: ``sparse``. The plan
rebuilt once in the order gradients really arrive: ``ddp.wrapper.bucket_rebuild``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch.autograd import Variable

from ddp.wrapper.bucket_buffers import BucketBuffers
from ddp.wrapper.bucket_rebuild import BucketRebuild
from ddp.wrapper.buckets import BucketSpec
from ddp.wrapper.reducer_support import Recorder, ReducerSupport, is_view_of
from ddp.wrapper.sparse import SparseGrads, unexpected_grad_message
from ddp.wrapper.static_graph import StaticGraph

__all__ = ["Reducer"]


class Reducer(BucketRebuild, ReducerSupport):
    """Bucketed, optionally overlapped gradient averaging for a fixed list of parameters.

    The bucket plan must be identical on every rank (see ``buckets``; a rebuild reuses its
    ``caps``, the first bucket's and the others'): ranks launch bucket collectives strictly in
    plan order, which keeps gloo's pairing of collectives consistent even when gradients become
    ready in a different order on each rank.
    """

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
        self._set_buffers(BucketBuffers.build(self._params, self._plan, counts_in_tail=True))
        if self._as_view:
            self._buf.adopt_grads(self._params)
        self._reset_iteration()
        self._init_stats()
        self._init_rebuild(caps)
        self._expect_backward = False
        self._used_since_sync = [False] * len(self._params)
        self._stash: dict[int, torch.Tensor] = {}
        # Kept alive: a parameter holds its accumulator weakly; a new one would lack our hook.
        self._accumulators = [p.view_as(p).grad_fn.next_functions[0][0] for p in self._params]
        self._handles = [
            acc.register_hook(functools.partial(self._on_grad, i))
            for i, acc in enumerate(self._accumulators)
        ]

    def _set_buffers(self, buf: BucketBuffers) -> None:
        self._buf = buf
        self._flats, self._views, self._where = buf.flats, buf.views, buf.where
        self._flags = buf.flags

    # ---- per iteration -------------------------------------------------------------------------

    def _reset_iteration(self) -> None:
        self._ready = [False] * len(self._params)
        self._pending = [len(spec.indices) for spec in self._plan]
        self._bucket_ready = [False] * len(self._plan)
        self._next_launch = 0
        self._works: list[dist.Work | torch.futures.Future | None] = [None] * len(self._plan)
        self._callback_queued = False

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
        self._ready_order, self._ready_t = [], []
        for flags in self._flags:
            flags.zero_()
        self._local_missing = []
        if self._hook is None:
            use_active = active_ranks is not None and not divide_by_initial_world_size
            self._div = active_ranks if use_active else self._world
        self._dist_ctx = dist_autograd_context
        self._expect_backward = True
        self._stats_backward_start()
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

    def _on_output_grad(self, _grad: torch.Tensor) -> None:
        # Registered on the forward's outputs (sink): runs in the outermost graph task, so
        # the callback ends the whole backward, not a checkpoint's inner one.
        if not self._callback_queued and self._expect_backward:
            Variable._execution_engine.queue_callback(self._finalize)
            self._callback_queued = True

    def _on_grad(self, i: int, _grad_inputs: object, grad_outputs: Sequence[torch.Tensor]) -> None:
        if not self._expect_backward:
            # Inside no_sync(): gradients accumulate in .grad; remember who took part.
            self._used_since_sync[i] = True
            return
        if (
            not self._callback_queued
        ):  # the outputs' hook did not run (ddp.wrapper.sink): queue here
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
        self._ready_t.append(time.perf_counter())
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
            if grad is not None and self._as_view and is_view_of(grad, view):
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
        elif self._as_view and is_view_of(grad, view):
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
                self._launch_t[b] = self._done_t[b] = time.perf_counter()
                self._next_launch += 1
                continue
            self._works[b] = self._start_bucket(b)
            self._next_launch += 1

    def _finalize(self) -> None:
        self._backward_end_t = time.perf_counter()
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
        self._count_synced_backward(self._ready_order, self._ready_t)
