"""The reducer's memory: one flat buffer per bucket, per-parameter views into it, and the
per-parameter "no gradient here" counts.

Two layouts, chosen by whether a communication hook is registered:

* no hook: each flat buffer is ``[gradients | one count per parameter]``. One allreduce sums
  gradients and counts together, so learning how many ranks missed each parameter is free.
* hook: each flat buffer holds gradients only (it is what ``GradBucket.buffer()`` exposes, and
  a hook may compress, rescale or replace it), and all counts live in one separate small tensor
  that the reducer allreduces itself, only when it needs the global counts
  (``find_unused_parameters`` or the first ``static_graph`` iteration).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ddp.wrapper.buckets import BucketSpec

__all__ = ["BucketBuffers"]


@dataclass
class BucketBuffers:
    """``flats[b]``: what bucket b's collective (or hook) works on. ``views[i]``: parameter i's
    gradient slot, shaped like it. ``where[i]``: (bucket, slot). ``flags[b]``: bucket b's counts,
    a view into ``flats[b]``'s tail or into ``flag_store``."""

    flats: list[torch.Tensor]
    views: list[torch.Tensor]
    where: list[tuple[int, int]]
    flags: list[torch.Tensor]
    flag_store: torch.Tensor | None  # only in the hook layout

    @classmethod
    def build(
        cls, params: Sequence[torch.Tensor], plan: Sequence[BucketSpec], *, counts_in_tail: bool
    ) -> BucketBuffers:
        n = len(params)
        where: list[tuple[int, int]] = [(-1, -1)] * n
        views: list[torch.Tensor] = [torch.empty(0)] * n
        flats: list[torch.Tensor] = []
        flags: list[torch.Tensor] = []
        store = None
        if not counts_in_tail:
            total = sum(len(spec.indices) for spec in plan)
            store = torch.zeros(total, dtype=torch.float32, device=_device(plan))
        start = 0
        for b, spec in enumerate(plan):
            tail = len(spec.indices) if counts_in_tail else 0
            flat = torch.zeros(spec.numel + tail, dtype=spec.dtype, device=spec.device)
            offset = 0
            for slot, i in enumerate(spec.indices):
                p = params[i]
                where[i] = (b, slot)
                views[i] = flat[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
            flats.append(flat)
            if store is None:
                flags.append(flat[spec.numel :])
            else:
                flags.append(store[start : start + len(spec.indices)])
                start += len(spec.indices)
        assert all(b >= 0 for b, _ in where), "every parameter must be in one bucket"
        return cls(flats, views, where, flags, store)

    @torch.no_grad()
    def adopt_grads(self, params: Sequence[torch.Tensor]) -> None:
        """gradient_as_bucket_view: make every existing ``.grad`` a view into these buffers,
        keeping its values (called at construction and when the layout changes)."""
        for p, view in zip(params, self.views, strict=True):
            if p.grad is not None:
                view.copy_(p.grad)
                p.grad = view


def _device(plan: Sequence[BucketSpec]) -> torch.device:
    return plan[0].device if plan else torch.device("cpu")
