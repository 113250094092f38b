"""``GradBucket``: what a communication hook sees of one bucket, with torch's method names.

torch's own hooks (``default_hooks``, ``powerSGD_hook``, the compression wrappers) only talk to
the bucket through ``index()``, ``buffer()``, ``set_buffer()``, ``is_last()``, ``gradients()``
and ``parameters()``, so an object with those methods lets them run on this reducer unchanged.

The buffer holds this rank's *unaveraged* gradients of the bucket and nothing else: the
reducer's per-parameter "no gradient here" counts live elsewhere when a hook is registered, so a
hook that compresses or rescales the buffer can never corrupt them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

__all__ = ["GradBucket", "check_hook_annotations", "hook_result"]


class GradBucket:
    """One bucket as handed to ``hook(state, bucket)``; see torch.distributed.GradBucket."""

    __slots__ = ("_buffer", "_index", "_is_last", "_params", "_shapes")

    def __init__(
        self,
        index: int,
        buffer: torch.Tensor,
        is_last: bool,
        params: Sequence[torch.Tensor],
    ) -> None:
        self._index = index
        self._buffer = buffer
        self._is_last = is_last
        self._params = list(params)
        self._shapes = [p.shape for p in self._params]

    def index(self) -> int:
        """Position of the bucket in launch order (0 fills first); stable across iterations,
        which is what stateful hooks (PowerSGD's error feedback, warm start) key on."""
        return self._index

    def buffer(self) -> torch.Tensor:
        """The flat 1-D tensor of the bucket's gradients (or what ``set_buffer`` put there)."""
        return self._buffer

    def set_buffer(self, buffer: torch.Tensor) -> None:
        """Replace the tensor ``buffer()`` returns (e.g. by a compressed copy)."""
        self._buffer = buffer

    def is_last(self) -> bool:
        """True for the bucket launched last in an iteration: hooks count iterations on it."""
        return self._is_last

    def gradients(self) -> list[torch.Tensor]:
        """Per-parameter views of ``buffer()``, shaped like the parameters, in bucket order
        (a sparse gradient's bucket holds it alone: then the buffer itself)."""
        if self._buffer.is_sparse:
            return [self._buffer]
        out, offset = [], 0
        for shape in self._shapes:
            n = shape.numel()
            out.append(self._buffer[offset : offset + n].view(shape))
            offset += n
        return out

    def parameters(self) -> list[torch.Tensor]:
        """The parameters whose gradients the bucket holds, in the order of ``gradients()``."""
        return list(self._params)


def hook_result(value: object, bucket: int, numel: int) -> torch.Tensor:
    """The tensor a hook's future resolved to. torch's contract is a single tensor; a one-element
    list (what ``Work.get_future()`` yields) is accepted too, since user hooks often return that
    future directly."""
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"the communication hook's future for bucket {bucket} resolved to "
            f"{type(value).__name__}; it must hold one tensor with the bucket's {numel} elements "
            "(e.g. return dist.all_reduce(t, async_op=True).get_future().then(lambda f: "
            "f.value()[0]))"
        )
    if value.numel() != numel:
        raise ValueError(
            f"the communication hook returned {value.numel()} elements for bucket {bucket}, "
            f"which holds {numel} gradient elements; return a tensor shaped like bucket.buffer()"
        )
    return value


def check_hook_annotations(hook: Callable) -> None:
    """torch's checks of a hook's annotations, with torch's errors, so a hook that torch's DDP
    refuses is refused here too (string annotations are compared by name)."""
    try:
        sig = inspect.signature(hook)
    except (TypeError, ValueError):  # builtins without a signature: nothing to check
        return
    bucket = sig.parameters.get("bucket")
    ann = bucket.annotation if bucket is not None else inspect.Parameter.empty
    if isinstance(ann, str):
        ok = ann.endswith("GradBucket")
    else:
        ok = (
            ann is inspect.Parameter.empty
            or ann is dist.GradBucket
            or (getattr(ann, "__name__", "") == "GradBucket")
        )
    if not ok:
        raise ValueError("Communication hook: bucket annotation should be dist.GradBucket.")
    ret = sig.return_annotation
    if isinstance(ret, str):
        ok = ret.replace(" ", "") in ("torch.futures.Future[torch.Tensor]", "Future[Tensor]")
    else:
        ok = ret is inspect.Signature.empty or ret == torch.futures.Future[torch.Tensor]
    if not ok:
        raise ValueError(
            "Communication hook: return annotation should be torch.futures.Future[torch.Tensor]."
        )
