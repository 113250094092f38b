"""The reducer's end of backward: waiting for the buckets, reading the unused-parameter counts,
writing the results back; the stamps it keeps for timelines and DDP logging data; registering
a communication hook, and the zero-gradient backward a joined rank shadows.

Split from ``reducer`` so that file holds only the per-iteration state machine; these run
once per bucket or per iteration, not once per parameter.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.distributed as dist

from ddp.wrapper.bucket_buffers import BucketBuffers
from ddp.wrapper.buckets import BucketSpec
from ddp.wrapper.grad_bucket import GradBucket, hook_result

__all__ = ["Recorder", "ReducerSupport", "is_view_of"]


class Recorder(Protocol):
    def record(
        self, op: str, *, step: int, bucket: int | None = None, nbytes: int = 0
    ) -> contextlib.AbstractContextManager[int]: ...

    def start(self, op: str, *, step: int, bucket: int | None = None, nbytes: int = 0) -> int: ...

    def complete(self, seq: int) -> None: ...

    def fail(self, seq: int, error: str) -> None: ...


def is_view_of(grad: torch.Tensor, view: torch.Tensor) -> bool:
    return grad.data_ptr() == view.data_ptr() and grad.shape == view.shape


class ReducerSupport:
    """Mixin of ``ddp.wrapper.reducer.Reducer``; the attributes it reads are set there."""

    # How the end of backward waits for each bucket's collective. Live recovery replaces it
    # with a wait that a peer's abort notice interrupts (ddp.recovery.protocol.waiting).
    wait_work: Callable[[Any], Any] = staticmethod(lambda work: work.wait())

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
        old = self._views
        self._set_buffers(BucketBuffers.build(self._params, self._plan, counts_in_tail=False))
        if self._as_view:
            with torch.no_grad():
                for p, view, prev in zip(self._params, self._views, old, strict=True):
                    if p.grad is not None and is_view_of(p.grad, prev):
                        view.copy_(prev)
                        p.grad = view
        self._hook, self._hook_state = hook, state
        self._div = 1
        self._local_only = False  # the hook runs at any world size

    @property
    def has_comm_hook(self) -> bool:
        return self._hook is not None

    def remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _needs_global_counts(self) -> bool:
        return self._find_unused or self.static.first_iteration

    def shadow_backward(self) -> None:
        """The collectives of one synchronised backward with zero gradients, for a rank that
        has run out of inputs under ``join()`` while others still train. With unused-parameter
        detection it keeps reporting the parameters it missed in its own last iteration (all,
        if it never trained), as torch's joined reducer keeps contributing its last used-map:
        so the others' counts, and which .grad they leave untouched, match torch's."""
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
        if self._sparse:  # last, as in Reducer._finalize
            self._sparse.shadow(self._hook, self._hook_state)
        self._count_synced_backward([])  # no order of its own: rank 0's (or the default) rules

    def _init_stats(self) -> None:
        # perf_counter() stamps of the last synchronised backward, for timelines and logging
        self._launch_t = [0.0] * len(self._plan)
        self._done_t = [0.0] * len(self._plan)
        self._backward_start_t = 0.0
        self._backward_end_t = 0.0
        self._comm_end_t = 0.0
        self.last_comm_wait_s = 0.0
        self.last_unused_bytes = 0

    def _stats_backward_start(self) -> None:
        self._backward_start_t = time.perf_counter()

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
    def last_timeline(self) -> dict[str, object]:
        """perf_counter() stamps of the last synchronised backward: when it ended, and each
        bucket's (launch, completion) in launch order. Completion is when the allreduce really
        finished if a flight recorder is attached, else when ``wait()`` returned."""
        return {
            "backward_end": self._backward_end_t,
            "buckets": list(zip(self._launch_t, self._done_t, strict=True)),
        }

    @property
    def last_stamps(self) -> dict[str, float]:
        """perf_counter() stamps of the last synchronised backward, for DDP logging data."""
        return {
            "backward_compute_start": self._backward_start_t,
            "backward_compute_end": self._backward_end_t,
            "backward_comm_start": min(self._launch_t, default=0.0),
            "backward_comm_end": self._comm_end_t,
        }

    def _start_bucket(self, b: int) -> dist.Work | torch.futures.Future:
        """Launch bucket b's allreduce (or hand it to the comm hook), stamped and recorded."""
        flat = self._flats[b]
        seq = None
        op = "allreduce" if self._hook is None else "comm_hook"
        if self.recorder is not None:
            nbytes = flat.numel() * flat.element_size()
            seq = self.recorder.start(op, step=self.step, bucket=b, nbytes=nbytes)
        self._launch_t[b] = time.perf_counter()
        if self._hook is None:
            work = self._pg_obj.allreduce([flat])
        else:
            last = b == len(self._plan) - 1
            work = self._hook(self._hook_state, GradBucket(b, flat, last, self._bucket_params[b]))
        if self.recorder is not None:
            # Runs on gloo's thread when the collective really finishes (not when we get around
            # to waiting), so the timeline shows how much of it hid behind backward. It needs
            # the GIL on that thread, which can delay the next bucket by a little, so only
            # instrumented runs pay for it.
            fut = work.get_future() if self._hook is None else work
            fut.add_done_callback(functools.partial(self._on_done, b, seq))
        return work

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

    def _wait_all(self) -> None:
        t0 = time.perf_counter()
        for b, work in enumerate(self._works):
            if work is None:
                assert self._local_only, "every bucket launched a collective"
                continue
            value = self.wait_work(work)
            if self._hook is not None:
                flat = self._flats[b]
                result = hook_result(value, b, flat.numel())
                if result.data_ptr() != flat.data_ptr():  # e.g. a decompressed copy
                    flat.copy_(result.view_as(flat))
            if self._done_t[b] < self._launch_t[b]:  # no completion callback (yet): now
                self._done_t[b] = time.perf_counter()
        if self._hook is not None and self._needs_global_counts():
            # Only after every hook's future is done: a hook may issue follow-up collectives
            # from its callbacks (PowerSGD does), and issuing ours in between on one rank but
            # not another would pair mismatched collectives across ranks.
            assert self._buf.flag_store is not None
            dist.all_reduce(self._buf.flag_store, group=self._pg)
        self._comm_end_t = time.perf_counter()
        self.last_comm_wait_s = self._comm_end_t - t0
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
