"""The heal's state format and digest, pure: any nested state of tensors and JSON values goes
through flatten/unflatten intact (no pickle), the digest sees one bit anywhere (parameters,
buffers, optimizer state), and the protocol layer imports nothing of the demo program."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

from ddp.recovery.protocol.heal import _pack, _unpack, flatten, state_digest, unflatten

RECOVERY = Path(__file__).parents[2] / "ddp" / "recovery"


def _state() -> tuple[nn.Module, torch.optim.Optimizer, dict]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    opt = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.9, 0.99))
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3)
    return model, opt, {"m": model.state_dict(), "o": opt.state_dict(), "s": sched.state_dict()}


def _same(a: object, b: object) -> None:
    assert type(a) is type(b) or isinstance(a, dict), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    else:
        assert a == b


def test_state_goes_through_header_and_bytes_intact():
    model, _, state = _state()
    skeleton, tensors = flatten(state)
    header, payload = _pack(skeleton, tensors)
    assert payload.dtype == torch.uint8 and int(header.sum()) == payload.numel()
    back = _unpack(header, payload)
    _same(state, back)  # int keys of the optimizer's state, the betas tuple, 0-dim tensors
    fresh = torch.optim.Adam(model.parameters(), lr=0.5)
    fresh.load_state_dict(back["o"])  # what load_state_dict callables get is loadable
    assert fresh.param_groups[0]["lr"] == 0.01 and fresh.param_groups[0]["betas"] == (0.9, 0.99)
    assert unflatten(skeleton, tensors)["s"] == state["s"]


@pytest.mark.parametrize("where", ["weight", "running_mean", "exp_avg_sq", "step"])
def test_digest_sees_one_bit_in_parameters_buffers_and_optimizer_state(where):
    _, _, state = _state()
    before = state_digest(flatten(state)[1])
    if where == "weight":
        t = state["m"]["0.weight"]
    elif where == "running_mean":
        t = state["m"]["1.running_mean"]
    else:
        t = state["o"]["state"][0][where]
    flat = t.view(-1).view(torch.int32) if t.dtype == torch.float32 else t.view(-1)
    flat[0] ^= 1  # the lowest bit of one element
    assert state_digest(flatten(state)[1]) != before


def test_digest_tells_apart_what_a_sum_cannot():
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([2.0, 1.0])
    assert float(a.sum()) == float(b.sum())
    assert state_digest([a]) != state_digest([b])


def test_a_value_that_is_neither_tensor_nor_json_is_refused_in_one_line():
    with pytest.raises(TypeError, match=r"state value at state\.gen is a Generator: .*no pickle"):
        flatten({"gen": torch.Generator()})


def test_the_protocol_layer_imports_nothing_of_the_demo_program():
    protocol = sorted([*RECOVERY.glob("protocol/*.py"), *RECOVERY.glob("etcd/*.py")])
    assert len(protocol) >= 15, protocol
    for path in [*protocol, RECOVERY / "api.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not name.startswith("ddp.program"), f"{path.name} imports {name}"
                assert not name.startswith("ddp.recovery.demo"), f"{path.name} imports {name}"
