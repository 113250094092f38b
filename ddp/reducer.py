"""The reducer: turns per-parameter "gradient ready" events into bucketed allreduces.

Life of one synchronised iteration:

1. ``prepare_for_backward`` (end of forward) resets the per-iteration state and, with
   ``find_unused_parameters``, marks the parameters the forward never reached as ready with a zero
   contribution.
2. Backward fires a post-accumulate-grad hook per parameter. The hook copies the gradient into
   its slot of the bucket's flat buffer (or, with ``gradient_as_bucket_view``, finds it already
   there). When a bucket's last slot fills, and every earlier bucket has been launched, its
   allreduce starts asynchronously (``overlap=True``) while backward carries on.
3. A callback queued on the autograd engine runs when backward finishes (still inside
   ``loss.backward()``): it launches what is left, waits for every bucket, checks which
   parameters got no gradient anywhere, and writes the averaged gradients back into ``.grad``.

Each flat buffer carries one extra element per parameter after the gradients: 1 where this rank
had no gradient for it. The allreduce sums those for free, so every rank learns, with no extra
collective, how many ranks missed each parameter. That count drives both the "unused on every
rank: leave .grad alone" rule and the error for unused parameters without
``find_unused_parameters=True``, which is raised on every rank together instead of hanging.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Sequence
from typing import Protocol

import torch
import torch.distributed as dist
from torch.autograd import Variable

from ddp.buckets import BucketSpec

__all__ = ["Reducer"]


class _Recorder(Protocol):
    def record(
        self, op: str, *, step: int, bucket: int | None = None, nbytes: int = 0
    ) -> contextlib.AbstractContextManager[int]: ...

    def start(self, op: str, *, step: int, bucket: int | None = None, nbytes: int = 0) -> int: ...

    def complete(self, seq: int) -> None: ...

    def fail(self, seq: int, error: str) -> None: ...


def _is_view_of(grad: torch.Tensor, view: torch.Tensor) -> bool:
    return grad.data_ptr() == view.data_ptr() and grad.shape == view.shape


class Reducer:
    """Bucketed, optionally overlapped gradient averaging for a fixed list of parameters.

    The bucket plan must be identical on every rank (see ``ddp.buckets.plan_buckets``): ranks
    launch bucket allreduces strictly in plan order, which is what keeps gloo's pairing of
    collectives consistent even when gradients become ready in a different order on each rank.
    """

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        names: Sequence[str],
        plan: Sequence[BucketSpec],
        process_group: dist.ProcessGroup | None,
        *,
        overlap: bool,
        gradient_as_bucket_view: bool,
        find_unused_parameters: bool,
        recorder: _Recorder | None = None,
    ) -> None:
        self._params = list(params)
        self._names = list(names)
        self._plan = list(plan)
        self._pg = process_group
        self._world = dist.get_world_size(process_group)
        self._overlap = overlap
        self._as_view = gradient_as_bucket_view
        self._find_unused = find_unused_parameters
        self.recorder = recorder
        self.step = -1  # label for the flight recorder; the training loop sets it

        n = len(self._params)
        self._where: list[tuple[int, int]] = [(-1, -1)] * n  # param -> (bucket, slot)
        self._views: list[torch.Tensor] = [torch.empty(0)] * n
        self._flats: list[torch.Tensor] = []
        self._flags: list[torch.Tensor] = []  # per bucket: one "no gradient here" count per slot
        for b, spec in enumerate(self._plan):
            flat = torch.zeros(spec.numel + len(spec.indices), dtype=spec.dtype, device=spec.device)
            offset = 0
            for slot, i in enumerate(spec.indices):
                p = self._params[i]
                self._where[i] = (b, slot)
                self._views[i] = flat[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
            self._flats.append(flat)
            self._flags.append(flat[spec.numel :])
        assert all(b >= 0 for b, _ in self._where), "every parameter must be in one bucket"

        if self._as_view:
            with torch.no_grad():
                for p, view in zip(self._params, self._views, strict=True):
                    if p.grad is not None:
                        view.copy_(p.grad)
                        p.grad = view

        self._reset_iteration()
        # perf_counter() stamps of the last synchronised backward, for timelines
        self._launch_t = [0.0] * len(self._plan)
        self._done_t = [0.0] * len(self._plan)
        self._backward_end_t = 0.0
        self._expect_backward = False
        self._used_since_sync = [False] * n
        self._stash: dict[int, torch.Tensor] = {}
        self.last_comm_wait_s = 0.0
        self._handles = [
            p.register_post_accumulate_grad_hook(functools.partial(self._on_grad, i))
            for i, p in enumerate(self._params)
        ]

    @property
    def num_buckets(self) -> int:
        return len(self._plan)

    @property
    def last_timeline(self) -> dict[str, object]:
        """perf_counter() stamps of the last synchronised backward: when it ended, and each
        bucket's (launch, completion) in launch order. Completion is when the allreduce really
        finished if a flight recorder is attached, else when ``wait()`` returned."""
        return {
            "backward_end": self._backward_end_t,
            "buckets": list(zip(self._launch_t, self._done_t, strict=True)),
        }

    def remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    # ---- per iteration -------------------------------------------------------------------------

    def _reset_iteration(self) -> None:
        self._ready = [False] * len(self._params)
        self._pending = [len(spec.indices) for spec in self._plan]
        self._bucket_ready = [False] * len(self._plan)
        self._next_launch = 0
        self._works: list[dist.Work | None] = [None] * len(self._plan)
        self._callback_queued = False

    def prepare_for_backward(self, unused: Sequence[int] = ()) -> None:
        """Arm the reducer for the backward of the forward that just ran.

        ``unused``: indices of parameters this rank's forward did not reach (only with
        ``find_unused_parameters``); they are marked ready at once with a zero contribution.
        """
        if self._expect_backward:
            raise RuntimeError(
                "the previous forward's gradients were never reduced: every forward run with "
                "gradient sync must be followed by a backward through its outputs before the "
                "next forward. Wrap forwards you do not backpropagate in torch.no_grad() or "
                "no_sync()."
            )
        self._reset_iteration()
        for flags in self._flags:
            flags.zero_()
        self._expect_backward = True
        with torch.no_grad():  # forward runs with grad mode on; the hooks below do not need it
            for i in unused:
                # A parameter that took part in an earlier no_sync micro-step holds an
                # accumulated gradient that must be reduced though this last forward skipped it.
                self._mark_ready(i, missing=not self._used_since_sync[i])
            if all(self._ready):
                # No parameter is left for backward to reach (none at all, or this rank's
                # forward used none), so no hook will fire to queue the final callback: reduce
                # now, or the other ranks would wait for this rank's buckets forever.
                self._finalize()

    def _on_grad(self, i: int, param: torch.Tensor) -> None:
        if not self._expect_backward:
            # Inside no_sync(): gradients accumulate in .grad; remember who took part.
            self._used_since_sync[i] = True
            return
        if not self._callback_queued:
            # Must be queued from inside backward; it runs once the whole graph is done.
            Variable._execution_engine.queue_callback(self._finalize)
            self._callback_queued = True
        if self._ready[i]:
            raise RuntimeError(
                f"parameter {self._names[i]!r} received a gradient twice in one synchronised "
                "backward (reentrant backward, or a backward through a graph that find_unused_"
                "parameters marked unused). Run one backward per forward."
            )
        self._mark_ready(i, missing=False)

    def _mark_ready(self, i: int, *, missing: bool) -> None:
        # Called from backward hooks (grad mode is off there) or under no_grad: no decorator,
        # its per-call cost is paid once per parameter per step.
        p, view = self._params[i], self._views[i]
        b, slot = self._where[i]
        grad = p.grad
        if missing:
            if grad is not None and self._as_view and _is_view_of(grad, view):
                # The slot is about to be overwritten; keep this rank's .grad intact in case
                # no rank used the parameter (then .grad must come back untouched).
                self._stash[i] = grad.clone()
                p.grad = self._stash[i]
            view.zero_()
            self._flags[b][slot] = 1
        elif grad is None:
            raise RuntimeError(f"gradient hook fired for {self._names[i]!r} without a gradient")
        elif grad.is_sparse:
            raise RuntimeError(
                f"parameter {self._names[i]!r} has a sparse gradient, which this wrapper does "
                "not reduce; use dense gradients (e.g. nn.Embedding(..., sparse=False))"
            )
        elif self._as_view and _is_view_of(grad, view):
            # gradient_as_bucket_view: autograd accumulated straight into the bucket.
            # Pre-divide so the SUM-allreduce yields the mean (gloo has no AVG).
            if self._world > 1:
                view.div_(self._world)
        else:
            torch.div(grad, self._world, out=view)
            if self._as_view:
                p.grad = view
        self._ready[i] = True
        self._pending[b] -= 1
        if self._pending[b] == 0:
            self._bucket_ready[b] = True
            if self._overlap:
                self._launch_in_order()

    def _launch_in_order(self) -> None:
        # Bucket k+1 may fill before bucket k (different parameter order on this rank); it
        # still waits, because gloo pairs collectives by issue order across ranks.
        while self._next_launch < len(self._plan) and self._bucket_ready[self._next_launch]:
            b = self._next_launch
            flat = self._flats[b]
            seq = None
            if self.recorder is not None:
                seq = self.recorder.start(
                    "allreduce", step=self.step, bucket=b, nbytes=flat.numel() * flat.element_size()
                )
            self._launch_t[b] = time.perf_counter()
            work = dist.all_reduce(flat, group=self._pg, async_op=True)
            if self.recorder is not None:
                # Runs on gloo's thread when the allreduce really finishes (not when we get
                # around to waiting), so the timeline shows how much of it hid behind
                # backward. It needs the GIL on that thread, which can delay the next bucket
                # by a little, so only instrumented runs pay for it.
                work.get_future().add_done_callback(functools.partial(self._on_done, b, seq))
            self._works[b] = work
            self._next_launch += 1

    def _on_done(self, b: int, seq: int | None, fut: torch.futures.Future) -> None:
        self._done_t[b] = time.perf_counter()
        if seq is None or self.recorder is None:
            return
        try:
            fut.value()
        except Exception as e:  # the error itself surfaces to the caller through wait()
            self.recorder.fail(seq, str(e))
        else:
            self.recorder.complete(seq)

    def _finalize(self) -> None:
        self._backward_end_t = time.perf_counter()
        self._expect_backward = False
        if not all(self._ready):
            with torch.no_grad():
                for i, ready in enumerate(self._ready):
                    if not ready:
                        # Never reached by backward. Its slot (zero + flag, or a gradient
                        # accumulated under no_sync) still has to travel with the bucket, or
                        # the other ranks would wait for this bucket forever.
                        self._mark_ready(i, missing=not self._used_since_sync[i])
        self._launch_in_order()
        assert self._next_launch == len(self._plan), "every bucket launched exactly once"

        t0 = time.perf_counter()
        for b, work in enumerate(self._works):
            assert work is not None
            work.wait()
            if self._done_t[b] < self._launch_t[b]:  # no completion callback (yet): now
                self._done_t[b] = time.perf_counter()
        self.last_comm_wait_s = time.perf_counter() - t0
        # Drop the finished works: a Work kept alive into interpreter shutdown can be
        # destroyed from gloo's thread after Python is gone.
        self._works = [None] * len(self._plan)

        missed = self._missing_counts()
        if missed and not self._find_unused:
            raise RuntimeError(self._unused_message(missed))
        self._write_back(missed)
        self._stash.clear()
        self._used_since_sync = [False] * len(self._params)

    def _missing_counts(self) -> dict[int, int]:
        """Parameter index -> number of ranks that had no gradient for it (only nonzero ones)."""
        out: dict[int, int] = {}
        for spec, flags in zip(self._plan, self._flags, strict=True):
            if bool(flags.any()):
                for slot, count in enumerate(flags.tolist()):
                    if count:
                        out[spec.indices[slot]] = round(count)
        return out

    @torch.no_grad()
    def _write_back(self, missed: dict[int, int]) -> None:
        skip = {i for i, c in missed.items() if c == self._world}  # unused on every rank
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

    def _unused_message(self, missed: dict[int, int]) -> str:
        names = [f"{self._names[i]} (on {c} of {self._world} ranks)" for i, c in missed.items()]
        return (
            "these parameters received no gradient in this backward, so their allreduce would "
            f"have been incomplete: {', '.join(names)}. If some parameters are legitimately "
            "unused in some forward passes, construct DistributedDataParallel with "
            "find_unused_parameters=True; otherwise make sure the loss depends on every "
            "parameter that requires grad (or set requires_grad=False on it)."
        )
