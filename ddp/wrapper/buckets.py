"""The bucket plan: which gradients travel together in one allreduce.

Pure logic, no process group: the plan depends only on the parameters' order, sizes, dtypes and
devices, so every rank that built the same model computes the same plan without talking. That is
what lets ranks launch bucket ``k`` without agreeing on it first.

Why buckets: every allreduce pays a latency floor (a few round trips between ranks) no matter how
small the tensor, so one allreduce per parameter tensor wastes it dozens of times per step. One
giant allreduce, on the other hand, can only start after the last gradient exists, which leaves
nothing to overlap with backward. Buckets of a few MB are the middle ground.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "FIRST_BUCKET_CAP_BYTES",
    "BucketSpec",
    "plan_buckets",
    "torch_caps",
    "torch_initial_plan",
]

# The first bucket to fill (the last layers, whose gradients backward produces first) is kept
# small so its allreduce can start early and hide behind the rest of backward; torch's reducer
# makes the same choice when the cap is left at its default (``torch_caps``).
FIRST_BUCKET_CAP_BYTES = 1 << 20


@dataclass(frozen=True)
class BucketSpec:
    """One bucket: indices into the parameter list, in the order they are laid out in the flat
    buffer, plus the dtype and device all of them share."""

    indices: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    numel: int

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()


def plan_buckets(
    params: Sequence[torch.Tensor],
    cap_bytes: int,
    first_cap_bytes: int | None = FIRST_BUCKET_CAP_BYTES,
    *,
    close_at_cap: bool = False,
    order: Sequence[int] | None = None,
) -> list[BucketSpec]:
    """Group ``params`` into buckets of at most ``cap_bytes``, in launch order.

    Parameters are visited in ``order`` (indices into ``params``), by default reverse
    registration order, which approximates the order backward produces their gradients (the
    last layer's first); the rebuild (``reducer``) passes the order they really arrived in. Each
    (dtype, device) pair has its own open bucket, since a flat buffer has one dtype. A bucket
    closes when the next parameter would push it over the cap; a single parameter larger than
    the cap gets a bucket of its own.
    ``cap_bytes == 0`` gives one bucket per parameter tensor (the naive baseline).
    The first bucket of each (dtype, device) uses ``min(cap_bytes, first_cap_bytes)``.

    ``close_at_cap``: torch's reducer rule instead. A parameter always joins the open bucket,
    which closes once it reaches the cap, so buckets may exceed it by their last parameter.
    What it changes in practice is the first bucket: with an MLP whose last weight is exactly
    the 1 MB first cap, the default rule leaves the bias alone in it (an allreduce that hides
    nothing), while torch's carries the whole last layer and overlaps the rest of backward.

    Buckets are returned in the order of their first parameter in that walk, which is the
    order in which they will fill during backward, and the order every rank must launch them in.
    """
    if cap_bytes < 0:
        raise ValueError(f"cap_bytes must be >= 0, got {cap_bytes}")
    walk = list(reversed(range(len(params)))) if order is None else list(order)
    if sorted(walk) != list(range(len(params))):
        raise ValueError(f"order must be a permutation of range({len(params)}), got {walk}")
    filling = _Filling(close_at_cap)
    for pos, i in enumerate(walk):
        p = params[i]
        key = (p.dtype, p.device)
        cap = cap_bytes
        if first_cap_bytes is not None and filling.closed.get(key, 0) == 0:
            cap = min(cap, first_cap_bytes)
        filling.add(key, pos, i, p.numel() * p.element_size(), cap)
    return filling.finish(params)


_Key = tuple[torch.dtype, torch.device]


class _Filling:
    """``plan_buckets``' walk in progress: the open bucket of each (dtype, device), and the
    buckets closed so far with the position in the walk of their first parameter."""

    def __init__(self, close_at_cap: bool) -> None:
        self.close_at_cap = close_at_cap
        self.open: dict[_Key, list[int]] = {}
        self.open_bytes: dict[_Key, int] = {}
        self.first_pos: dict[_Key, int] = {}
        self.closed: dict[_Key, int] = {}  # buckets closed per key (the first has its own cap)
        self.done: list[tuple[int, list[int]]] = []

    def add(self, key: _Key, pos: int, i: int, size: int, cap: int) -> None:
        """Put parameter ``i`` (``size`` bytes, at ``pos`` in the walk) in its key's bucket."""
        if not self.close_at_cap and key in self.open and self.open_bytes[key] + size > cap:
            self.close(key)
        if key not in self.open:
            self.open[key], self.open_bytes[key], self.first_pos[key] = [], 0, pos
        self.open[key].append(i)
        self.open_bytes[key] += size
        if self.close_at_cap and self.open_bytes[key] >= cap:
            self.close(key)

    def close(self, key: _Key) -> None:
        self.done.append((self.first_pos[key], self.open.pop(key)))
        self.open_bytes.pop(key)
        self.closed[key] = self.closed.get(key, 0) + 1

    def finish(self, params: Sequence[torch.Tensor]) -> list[BucketSpec]:
        """Close the open buckets; all of them, in the order their first parameter was met."""
        for key in list(self.open):
            self.close(key)
        self.done.sort(key=lambda item: item[0])
        return [
            BucketSpec(
                indices=tuple(idx),
                dtype=params[idx[0]].dtype,
                device=params[idx[0]].device,
                numel=sum(params[i].numel() for i in idx),
            )
            for _, idx in self.done
        ]


def torch_caps(bucket_cap_mb: float | None) -> tuple[int, int]:
    """(first bucket's cap, every other bucket's cap) in bytes, by torch 2.13's rule: the
    small 1 MB first bucket only when ``bucket_cap_mb`` is left at its default (None, 25 MB);
    an explicit cap applies to every bucket."""
    if bucket_cap_mb is None:
        return FIRST_BUCKET_CAP_BYTES, 25 << 20
    cap = int(bucket_cap_mb * (1 << 20))
    return cap, cap


def torch_initial_plan(
    params: Sequence[torch.Tensor], caps: tuple[int, int], *, one_bucket: bool
) -> list[BucketSpec]:
    """torch DDP's construction-time plan, which ``DistributedDataParallel`` uses until its
    rebuild (``reducer``), so that ``bucket_sizes`` and per-bucket hook state match
    torch's. ``one_bucket`` (torch: unless ``find_unused_parameters`` without a static graph):
    a single bucket per dtype for the first iteration, since registration order may not be
    the order gradients arrive, and a bucket launched early on one rank could pair with
    another collective that backward issues on another (the rebuild then buckets by the real
    order). Otherwise buckets are filled in registration order by the close-at-cap rule, the
    first cap on the first-defined parameters, and launched in reverse: the small bucket is
    the last to launch, so the allreduce left exposed after backward ends is short."""
    first, cap = caps
    if one_bucket:
        first = cap = sys.maxsize
    return plan_buckets(params, cap, first, close_at_cap=True, order=range(len(params)))[::-1]
