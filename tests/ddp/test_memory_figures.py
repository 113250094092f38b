"""What a rank's step records say it holds (``ddp.program.memory``): the optimizer state's
bytes, exact for a plain Adam and for torch's ``ZeroRedundancyOptimizer`` (its local shard's
only, on 2 spawned gloo ranks), and the process's peak RSS."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer

from ddp.program.memory import optimizer_state_bytes, peak_rss_mib
from tests.ddp.common import case_tests


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.Linear(256, 8))


def _param_bytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def _step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(4, 64)).sum().backward()
    opt.step()


def test_adam_holds_two_tensors_per_parameter_and_a_step_each():
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    assert optimizer_state_bytes(opt) == 0  # the state is made at the first step
    _step(model, opt)
    params = list(model.parameters())
    steps = sum(opt.state[p]["step"].untyped_storage().nbytes() for p in params)
    assert optimizer_state_bytes(opt) == 2 * _param_bytes(params) + steps


def test_sgd_without_momentum_holds_nothing_and_with_momentum_one_tensor():
    model = _model()
    plain = torch.optim.SGD(model.parameters(), lr=0.1)
    _step(model, plain)
    assert optimizer_state_bytes(plain) == 0
    heavy = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _step(model, heavy)
    assert optimizer_state_bytes(heavy) == _param_bytes(model.parameters())


def test_peak_rss_grows_with_what_the_process_touches():
    before = peak_rss_mib()
    block = torch.ones(int((before + 64) * 2**20) // 4)  # larger than the peak so far, written
    assert peak_rss_mib() >= before + 64
    del block


def _zero_holds_its_shard_only(rank: int, world: int) -> None:
    model = _model()
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    _step(model, opt)
    mine = list(opt.optim.state)  # the local optimizer's parameters: this rank's shard
    assert mine and len(mine) < len(list(model.parameters()))
    steps = sum(opt.optim.state[p]["step"].untyped_storage().nbytes() for p in mine)
    assert optimizer_state_bytes(opt) == 2 * _param_bytes(mine) + steps
    total = torch.tensor([optimizer_state_bytes(opt) - steps], dtype=torch.int64)
    torch.distributed.all_reduce(total)
    assert int(total) == 2 * _param_bytes(model.parameters())  # the shards make the whole


CASES = {"zero_holds_its_shard_only": _zero_holds_its_shard_only}
results, test_case_on_every_rank = case_tests(__name__, CASES, world=2, timeout_s=200)
