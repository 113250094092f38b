"""The data when the world changes: the global batch is kept, the per-rank batch follows.

Step ``s`` trains on the same ``--batch-size`` samples whatever the world: a global sampler
(one permutation of the data set per epoch, seeded) picks them, and the members of the quorum
split them into contiguous shards by group rank, the first ``batch % world`` one sample larger.
So a run that loses a rank computes what it would have computed without the loss, and the
single-process reference (which trains on the global batch) needs no change at all.

Unequal shards need one correction: the reducer averages the ranks' gradients, and the average
of per-shard mean losses is the global mean only when the shards are equal. Scaling rank r's
loss by ``n_r * world / batch`` makes the averaged gradient that of the global-batch mean
(the factor is exactly 1.0 when the shards are equal, so nothing changes there).
"""

from __future__ import annotations

import torch

__all__ = ["GlobalBatches"]


class GlobalBatches:
    """Indices of each step's global batch and of a group rank's shard of it."""

    def __init__(self, dataset_size: int, batch_size: int, seed: int) -> None:
        if batch_size > dataset_size:
            raise ValueError(f"--batch-size {batch_size} exceeds the {dataset_size} samples")
        self.n, self.batch = dataset_size, batch_size
        self.steps_per_epoch = dataset_size // batch_size
        self._gen = torch.Generator().manual_seed(20_000 + seed)
        self._perms: list[torch.Tensor] = []

    def indices(self, step: int) -> torch.Tensor:
        """The global batch of 0-based micro-step ``step``."""
        epoch, i = divmod(step, self.steps_per_epoch)
        while len(self._perms) <= epoch:
            self._perms.append(torch.randperm(self.n, generator=self._gen))
        return self._perms[epoch][i * self.batch : (i + 1) * self.batch]

    def shard(self, step: int, group_rank: int, world: int) -> tuple[torch.Tensor, float]:
        """This rank's part of step ``step``'s global batch, and its loss scale."""
        base, extra = divmod(self.batch, world)
        start = group_rank * base + min(group_rank, extra)
        size = base + (1 if group_rank < extra else 0)
        if size == 0:
            raise ValueError(f"--batch-size {self.batch} leaves rank {group_rank} of {world} empty")
        return self.indices(step)[start : start + size], size * world / self.batch
