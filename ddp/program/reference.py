"""The single-process reference that DDP must equal, and the parameter fingerprints used to
compare replicas with it and with each other.

Exact runs compare step by step: before every step the reference takes rank 0's weights and
optimizer state (``anchor``), so each DDP step is judged against one single-process step from
the same point. Left to train on its own, the reference would drift from DDP by float rounding
(the ranks sum gradients in another order), and the drift compounds: after a few hundred steps
one ReLU input that rounds to the other side of zero sends the two runs apart (measured: 4 ranks,
step 116: 1.8e-07 -> 3.2e-06, 2.4e-05 by step 130), which says nothing about synchronisation. A
missing or wrong average, on the other hand, shows in the first step it happens. Compressed
runs let the reference run free: what compression costs is exactly what accumulates.
"""

from __future__ import annotations

import copy
import hashlib

import torch
import torch.nn.functional as F
from torch import nn

from ddp.program.config import TrainConfig
from ddp.program.data import ShardSampler, global_batch
from ddp.program.models import build_model
from ddp.program.optimizer import build_optimizer

__all__ = ["Reference", "checksum", "max_param_diff", "params_sha256"]


@torch.no_grad()
def checksum(module: nn.Module) -> float:
    """float64 sum of all parameters: equal replicas give bitwise-equal sums."""
    return float(sum(p.detach().double().sum() for p in module.parameters()))


@torch.no_grad()
def params_sha256(module: nn.Module) -> str:
    """Bitwise fingerprint of all parameters (what "resumed == uninterrupted" compares)."""
    h = hashlib.sha256()
    for p in module.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


@torch.no_grad()
def max_param_diff(a: nn.Module, b: nn.Module) -> float:
    """Largest elementwise |a - b| over all parameters."""
    return max(
        float((p - q).abs().max()) for p, q in zip(a.parameters(), b.parameters(), strict=True)
    )


class Reference:
    """The single-process run that DDP must equal: same init, same optimizer (unsharded, the
    same class and settings), global batch."""

    def __init__(self, cfg: TrainConfig, world_size: int, n: int) -> None:
        self.model = build_model(cfg.model, cfg.seed)
        self.opt = build_optimizer(self.model, cfg)
        lb = cfg.local_batch(world_size)
        self.samplers = [ShardSampler(n, r, world_size, lb, cfg.seed) for r in range(world_size)]
        self.accumulate = cfg.accumulate

    @torch.no_grad()
    def anchor(self, module: nn.Module, opt_state: dict) -> None:
        """Start the next step from ``module``'s weights and buffers and the optimizer state
        ``opt_state`` (a plain optimizer's ``state_dict``: ``ddp.program.optimizer.
        full_state_dict``), as copies: the reference's step must not touch DDP's momentum."""
        for q, p in zip(self.model.parameters(), module.parameters(), strict=True):
            q.copy_(p)
        for q, p in zip(self.model.buffers(), module.buffers(), strict=True):
            q.copy_(p)
        self.opt.load_state_dict(copy.deepcopy(opt_state))

    def step(self, x: torch.Tensor, y: torch.Tensor, step: int) -> float:
        """One step on the whole global batch of 0-based ``step``: every rank's micro-batches
        of it (``--accumulate``), as one batch, so accumulation is judged against one step."""
        k = self.accumulate
        idx = torch.cat([global_batch(self.samplers, step * k + j) for j in range(k)])
        self.opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.model(x[idx]), y[idx])
        loss.backward()
        self.opt.step()
        return loss.item()
