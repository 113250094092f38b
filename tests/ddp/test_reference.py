"""The single-process reference: anchoring copies DDP's state and shares none of it."""

from __future__ import annotations

import torch

from ddp.program.config import TrainConfig
from ddp.program.data import make_dataset
from ddp.program.models import build_model
from ddp.program.optimizer import build_optimizer
from ddp.program.reference import Reference, max_param_diff


def _trained(cfg: TrainConfig, steps: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    module = build_model(cfg.model, cfg.seed + 1)  # other weights than the reference's
    opt = build_optimizer(module, cfg)
    for _ in range(steps):
        opt.zero_grad()
        module(torch.randn(8, 32)).square().mean().backward()
        opt.step()
    return module, opt


def test_anchor_takes_the_weights_and_momentum_as_copies():
    cfg = TrainConfig()
    module, opt = _trained(cfg, 3)
    ref = Reference(cfg, 4, 4096)
    assert max_param_diff(module, ref.model) > 0
    ref.anchor(module, opt.state_dict())
    assert max_param_diff(module, ref.model) == 0
    before = [opt.state[p]["momentum_buffer"].clone() for p in module.parameters()]
    x, y = make_dataset(cfg.seed)
    ref.step(x, y, 0)
    after = [opt.state[p]["momentum_buffer"] for p in module.parameters()]
    for b, a in zip(before, after, strict=True):
        assert torch.equal(b, a), "the reference's step changed DDP's momentum"
    assert max_param_diff(module, ref.model) > 0, "the reference stepped"
