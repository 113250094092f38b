"""Synthetic data and the per-rank sampler.

The dataset is a seeded function of ``seed``, so every rank (and the single-process reference)
holds the same copy without any file. Rank ``r`` owns samples ``r, r+W, r+2W, ...`` and
shuffles its shard every epoch with a generator seeded ``seed + rank``; the global batch of a
step is the concatenation of all ranks' local batches, which is what the reference trains on.
"""

from __future__ import annotations

import torch

from ddp.program.models import IN_FEATURES, NUM_CLASSES

__all__ = ["ShardSampler", "global_batch", "make_dataset"]


def make_dataset(seed: int, size: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and labels from a fixed random linear teacher (learnable, so the loss falls)."""
    g = torch.Generator().manual_seed(10_000 + seed)
    x = torch.randn(size, IN_FEATURES, generator=g)
    teacher = torch.randn(IN_FEATURES, NUM_CLASSES, generator=g)
    y = (x @ teacher).argmax(dim=1)
    return x, y


class ShardSampler:
    """Indices of rank ``rank``'s local batch at each step; a pure function of the step, so a
    resumed run continues with exactly the batches an uninterrupted run would have seen."""

    def __init__(
        self, dataset_size: int, rank: int, world_size: int, local_batch: int, seed: int
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        self.shard = torch.arange(rank, dataset_size, world_size)
        if local_batch > len(self.shard):
            raise ValueError(
                f"local batch {local_batch} is larger than the shard ({len(self.shard)} samples)"
            )
        self.local_batch = local_batch
        self.steps_per_epoch = len(self.shard) // local_batch
        self._gen = torch.Generator().manual_seed(seed + rank)
        self._perms: list[torch.Tensor] = []

    def indices(self, step: int) -> torch.Tensor:
        epoch, i = divmod(step, self.steps_per_epoch)
        while len(self._perms) <= epoch:  # one permutation per epoch, drawn in order
            self._perms.append(torch.randperm(len(self.shard), generator=self._gen))
        pick = self._perms[epoch][i * self.local_batch : (i + 1) * self.local_batch]
        return self.shard[pick]


def global_batch(samplers: list[ShardSampler], step: int) -> torch.Tensor:
    return torch.cat([s.indices(step) for s in samplers])
