"""Communication hooks by name, for the command line's ``--comm-hook``.

The hooks are torch's own (``torch.distributed.algorithms.ddp_comm_hooks``), registered through
``DistributedDataParallel.register_comm_hook``, so they work on this wrapper and on torch's
alike:

* ``fp16``: ``default_hooks.fp16_compress_hook`` (half the bytes on the wire).
* ``bf16``: the body of torch's ``bf16_compress_hook``. torch's wrapper refuses anything but
  NCCL (by its name), but gloo reduces bfloat16 on CPU, so ``gloo_bf16_compress_hook`` below
  calls the same body.
* ``powersgd``: ``powerSGD_hook`` with rank-1 approximation, error feedback and warm start,
  compressing from iteration ``POWERSGD_START_ITER`` (2: steps 1 and 2 run a plain
  allreduce; torch requires > 1 with error feedback or warm start).
* ``hierarchical`` and ``hierarchical-fp16``: ours, the two-level allreduce of
  :mod:`ddp.wrapper.hierarchical` (exact, or fp16 on the cross-node leg only).
"""

# No ``from __future__ import annotations``: torch's register_comm_hook compares the hook's
# annotations with dist.GradBucket and Future[Tensor] objects, and strings would not match.
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

from ddp.wrapper.hierarchical import register_hierarchical
from ddp.wrapper.hook_names import COMM_HOOKS, POWERSGD_RANK, POWERSGD_START_ITER

__all__ = ["COMM_HOOKS", "gloo_bf16_compress_hook", "register_named_hook"]


def gloo_bf16_compress_hook(
    process_group: Optional[dist.ProcessGroup],  # noqa: UP045 (evaluated at import on py3.10)
    bucket: dist.GradBucket,
) -> torch.futures.Future[torch.Tensor]:
    """Cast the bucket to bfloat16, divide by the group size, allreduce, cast back: torch's
    ``bf16_compress_hook`` without its NCCL-only guard."""
    return default_hooks._compress_hook(torch.bfloat16, process_group, bucket)


class _InOrder:
    """Runs ``hook`` on bucket k only once bucket k-1's future is done.

    PowerSGD issues its second and third collectives from future callbacks on gloo's thread.
    If the reducer meanwhile starts the next bucket from the main thread, the two threads'
    collectives can reach gloo in a different order on different ranks, and gloo pairs
    collectives by issue order. Waiting for the previous bucket first fixes the order (and
    costs overlap between buckets, which PowerSGD, bandwidth-bound, can spare).
    """

    def __init__(self, hook: Any) -> None:
        self.hook = hook
        # torch's register_comm_hook reads both names
        self.__qualname__ = getattr(hook, "__qualname__", repr(hook))
        self.__name__ = getattr(hook, "__name__", self.__qualname__)
        self._prev: torch.futures.Future | None = None

    def __call__(self, state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        if bucket.index() > 0 and self._prev is not None:
            self._prev.wait()
        fut = self.hook(state, bucket)
        self._prev = None if bucket.is_last() else fut
        return fut


def register_named_hook(
    model: Any,
    name: str,
    process_group: dist.ProcessGroup | None = None,
    *,
    matrix_approximation_rank: int = POWERSGD_RANK,
    start_powerSGD_iter: int = POWERSGD_START_ITER,
) -> object | None:
    """Register the communication hook called ``name`` (one of ``COMM_HOOKS``) on ``model``,
    a ``ddp.DistributedDataParallel`` or torch's. Returns the state passed to the hook:
    PowerSGD's ``PowerSGDState`` (its compression statistics, error feedback), else
    ``process_group``; the hierarchical hooks' ``HierarchicalState``, or ``process_group``
    where the topology is flat and they register nothing. ``"none"`` registers nothing and
    leaves the built-in averaging allreduce in place. Call it once, before training."""
    if name not in COMM_HOOKS:
        raise ValueError(f"unknown communication hook {name!r}; choose one of {COMM_HOOKS}")
    if name == "none":
        return process_group
    if name == "fp16":
        model.register_comm_hook(process_group, default_hooks.fp16_compress_hook)
        return process_group
    if name == "bf16":
        model.register_comm_hook(process_group, gloo_bf16_compress_hook)
        return process_group
    if name in ("hierarchical", "hierarchical-fp16"):
        dtype = torch.float16 if name == "hierarchical-fp16" else None
        state = register_hierarchical(model, process_group, cross_dtype=dtype)
        return process_group if state is None else state
    state = powersgd.PowerSGDState(
        process_group=process_group,
        matrix_approximation_rank=matrix_approximation_rank,
        start_powerSGD_iter=start_powerSGD_iter,
        use_error_feedback=True,
        warm_start=True,
    )
    model.register_comm_hook(state, _InOrder(powersgd.powerSGD_hook))
    return state
