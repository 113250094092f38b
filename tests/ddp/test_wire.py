"""What crosses between ranks besides gradients, as JSON and raw bytes: a state survives
bit for bit, and the receiver refuses a skeleton that does not describe what was sent."""

from __future__ import annotations

import io
import json
import random
from collections import OrderedDict

import pytest
import torch
from torch import nn

from ddp.program.checkpoint import rng_state
from ddp.wrapper.wire import decode_state, encode_state


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and (a.dtype, a.shape) == (b.dtype, b.shape)
            and torch.equal(_bits(a), _bits(b))  # NaN included
        )
    if isinstance(a, dict):
        return (
            type(a) is type(b)
            and list(a) == list(b)
            and all(_same(a[k], b[k]) for k in a)
            and getattr(a, "_metadata", None) == getattr(b, "_metadata", None)
        )
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and (a == b or a != a)  # a float NaN equals itself here


def test_a_training_state_round_trips_bit_for_bit():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model(torch.randn(5, 3)).sum().backward()
    opt.step()  # momentum buffers: optimizer state keyed by int
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "rng": rng_state(),  # a uint8 tensor and random's (int, tuple of 625 ints, None)
        "bucket_order": [2, 0, 1],
        "odd": {
            "nan": torch.tensor([float("nan"), -0.0, float("inf")]),
            "scalar": torch.tensor(3.25, dtype=torch.float64),
            "empty": torch.empty(0, 4),
            "flags": torch.tensor([True, False]),
            "half": torch.randn(3, dtype=torch.bfloat16),
            "strided": torch.arange(12.0).reshape(3, 4).t(),
            "floats": [0.1, 1e-300, float("inf")],
        },
    }
    # what the owner of a checkpoint holds: torch.load(weights_only=True)'s result
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    skeleton, blob = encode_state(loaded)
    assert blob.dtype == torch.uint8
    back = decode_state(json.loads(json.dumps(skeleton)), blob.clone())
    assert _same(loaded, back)
    assert back["model"]._metadata  # module versions, which load_state_dict reads
    model.load_state_dict(back["model"])
    opt.load_state_dict(back["optimizer"])
    random.setstate(back["rng"]["python"])


def test_anything_else_is_refused_on_both_sides():
    with pytest.raises(TypeError, match="cannot cross the wire"):
        encode_state({"f": open})  # a function: what pickle would carry and run
    skeleton, blob = encode_state({"w": torch.ones(2)})
    with pytest.raises(ValueError, match="more tensor bytes"):
        decode_state(skeleton, blob[:4])
    with pytest.raises(ValueError, match="no skeleton names"):
        decode_state(skeleton, torch.cat([blob, blob]))
    bad = json.loads(json.dumps(skeleton).replace("float32", "Tensor"))
    with pytest.raises(ValueError, match="not a torch dtype"):
        decode_state(bad, blob)
    with pytest.raises(ValueError, match="unexpected keys"):
        decode_state({"__reduce__": ["os.system", "true"]}, blob)
    assert decode_state(*encode_state(OrderedDict(a=1))) == OrderedDict(a=1)
