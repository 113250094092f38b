"""The demo models. Small enough for 4 CPU ranks on 2 cores, shaped to exercise the wrapper:

- ``mini``: a 3-layer MLP, the parity demo.
- ``deep``: many parameter tensors, so per-parameter allreduce pays its latency floor often
  (the bucketing experiment).
- ``conv``: a 1-D convolution stack over the 32 features read as a signal: every weight is
  reused at every position, so backward computes ~32x more per gradient byte than an MLP at the
  same batch (the overlap experiment: backward long enough to hide the allreduces behind).
- ``tower``: the ``conv`` stack made thin and tall (40 convolutions of 48 channels): 82
  tensors, 1.1 MB in all, so per-parameter allreduce pays its latency floor 82 times while a
  few buckets are bandwidth-bound, and backward fills them one layer at a time (the latency
  experiment's default: bucketing and overlap both pay).
- ``branchy``: an optional layer applied only to the samples that select it; on a small local
  batch some ranks see no such sample and the layer goes unused there (and sometimes on every
  rank), which needs ``find_unused_parameters=True``.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

from ddp.program.config import MODEL_NAMES

__all__ = [
    "MODELS",
    "BranchyMLP",
    "ConvNet",
    "DeepMLP",
    "MiniMLP",
    "TowerNet",
    "WideMLP",
    "build_model",
    "simulate_backward_compute",
]

IN_FEATURES = 32
NUM_CLASSES = 8


class MiniMLP(nn.Module):
    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(IN_FEATURES, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, NUM_CLASSES),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class DeepMLP(nn.Module):
    def __init__(self, depth: int = 12, hidden: int = 256) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(IN_FEATURES, hidden), nn.ReLU()]
        for _ in range(depth - 2):
            layers += [nn.Linear(hidden, hidden), nn.ReLU()]
        layers.append(nn.Linear(hidden, NUM_CLASSES))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ConvNet(nn.Module):
    """``depth`` same-size convolutions (``channels`` wide, kernel 3, length kept) over the
    input read as a 1-channel signal, linearly resampled from ``IN_FEATURES`` to ``length``
    points, mean-pooled into a linear head. The first layer (1 input channel) and the head are
    tiny; the others are equal, so a bucket cap cuts the gradients into equal buckets of whole
    layers. Compute per gradient byte grows with ``length`` (every weight is applied at every
    point)."""

    def __init__(self, channels: int = 128, depth: int = 8, length: int = IN_FEATURES) -> None:
        super().__init__()
        self.length = length
        layers: list[nn.Module] = [nn.Conv1d(1, channels, 3, padding=1), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Conv1d(channels, channels, 3, padding=1), nn.ReLU()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(channels, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        signal = x.unsqueeze(1)
        if signal.shape[-1] != self.length:
            signal = F.interpolate(signal, size=self.length, mode="linear", align_corners=False)
        return self.head(self.body(signal).mean(dim=2))


class TowerNet(ConvNet):
    """``ConvNet`` with 40 layers of 48 channels: many small, equal gradient tensors."""

    def __init__(self, channels: int = 48, depth: int = 40, length: int = IN_FEATURES) -> None:
        super().__init__(channels=channels, depth=depth, length=length)


class BranchyMLP(nn.Module):
    """Two always-used branches plus a ``rare`` layer for samples whose first feature exceeds
    ``threshold``. Masking per sample keeps the global-batch reference exact: the rare layer's
    gradient is the same whether the rare samples are split across ranks or not."""

    def __init__(self, hidden: int = 64, threshold: float = 1.5) -> None:
        super().__init__()
        self.threshold = threshold
        self.left = nn.Linear(IN_FEATURES, hidden)
        self.right = nn.Linear(IN_FEATURES, hidden)
        self.rare = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.left(x)) + torch.tanh(self.right(x))
        mask = x[:, 0] > self.threshold
        if bool(mask.any()):
            h = h.clone()
            h[mask] = h[mask] + torch.relu(self.rare(h[mask]))
        return self.head(h)


class WideMLP(DeepMLP):
    """``DeepMLP`` with 8 layers of 2048: a few large tensors, 101 MB of parameters."""

    def __init__(self, depth: int = 8, hidden: int = 2048) -> None:
        super().__init__(depth=depth, hidden=hidden)


MODELS = {
    "mini": MiniMLP,
    "deep": DeepMLP,
    "branchy": BranchyMLP,
    "conv": ConvNet,
    "tower": TowerNet,
    "wide": WideMLP,
}
# The configuration names the models without importing torch; the two lists must agree.
assert tuple(MODELS) == MODEL_NAMES, (tuple(MODELS), MODEL_NAMES)


def build_model(name: str, seed: int) -> nn.Module:
    """The same initial weights on every rank (DDP broadcasts them anyway; the single-process
    reference needs them too)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODELS)}")
    torch.manual_seed(seed)
    return MODELS[name]()


def simulate_backward_compute(module: nn.Module, total_ms: float) -> None:
    """Make backward take ``total_ms`` longer, spread evenly over the parameters' gradients.

    A stand-in for accelerator compute, which does not occupy the host's CPU: each gradient
    hook sleeps (releasing the GIL) before the gradient is accumulated, so buckets still fill
    one by one during backward and their allreduces can run behind the remaining "compute".
    On a CPU-only host where 4 ranks share 2 cores, real backward compute competes with gloo
    and the packet delayer for the same cores, and overlap cannot show.
    """
    params = [p for p in module.parameters() if p.requires_grad]
    each_s = total_ms / 1e3 / max(1, len(params))

    def compute(grad: torch.Tensor) -> torch.Tensor:
        time.sleep(each_s)
        return grad

    for p in params:
        p.register_hook(compute)
