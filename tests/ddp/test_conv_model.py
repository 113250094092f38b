"""The ``conv`` model and its thin, tall variant ``tower`` (the latency experiment's default
workload): their shapes, their bucket plans at the caps the experiments use, and parity of a
real 2-rank run."""

from __future__ import annotations

import pytest
import torch

from ddp.program.models import IN_FEATURES, NUM_CLASSES, ConvNet, build_model
from ddp.program.records import load_run
from ddp.wrapper.buckets import plan_buckets, torch_caps
from tests.helpers import run_ddp

MB = 1 << 20


def test_conv_maps_features_to_classes_and_its_weights_are_reused_along_the_signal():
    model = build_model("conv", seed=0)
    assert model(torch.randn(5, IN_FEATURES)).shape == (5, NUM_CLASSES)
    params = list(model.parameters())
    assert len(params) == 18  # 8 convolutions and the head, weight and bias each
    # Compute per gradient byte grows with the signal's length: same weights, longer signal.
    short, long_ = ConvNet(length=IN_FEATURES), ConvNet(length=4 * IN_FEATURES)
    assert [p.shape for p in short.parameters()] == [p.shape for p in long_.parameters()]
    assert long_.body(torch.zeros(2, 1, long_.length)).shape[-1] == 4 * IN_FEATURES


def test_a_small_cap_gives_every_convolution_its_own_bucket_and_a_tiny_last_one():
    params = list(build_model("conv", seed=0).parameters())
    layer = params[2].numel() * 4 + params[3].numel() * 4  # one inner convolution
    plan = plan_buckets(params, int(0.15 * MB), close_at_cap=True)
    assert len(plan) == 8
    assert all(b.nbytes >= layer for b in plan[:-1])  # b0 also holds the head
    assert plan[-1].indices == (1, 0) and plan[-1].nbytes < layer / 10  # the first layer
    two = plan_buckets(params, MB, close_at_cap=True)
    assert [len(b.indices) for b in two] == [14, 4]  # 1.3 MB: 6 convolutions and the head, 2


@pytest.mark.timeout(150)
def test_conv_parity_with_eight_buckets(tmp_path):
    conv = ["--model", "conv", "--bucket-cap-mb", "0.15", "--log-dir", str(tmp_path)]
    r = run_ddp("--world-size", "2", "--steps", "3", *conv, timeout=140)
    assert r.returncode == 0, r.stderr
    # step 1 runs with one bucket, then the plan is rebuilt by the cap (ddp.wrapper.reducer)
    assert [s.num_buckets for s in load_run(tmp_path)[0].steps] == [1, 8, 8]
    assert r.stdout.splitlines()[-1].startswith("parity holds: 2 replicas identical")


def test_tower_has_82_equal_small_layers_and_seven_buckets_at_the_latency_default():
    params = list(build_model("tower", seed=0).parameters())
    assert len(params) == 82  # 40 convolutions and the head, weight and bias each
    inner = [p.numel() for p in params[2:80]]
    assert set(inner[0::2]) == {48 * 48 * 3} and set(inner[1::2]) == {48}
    total = sum(p.numel() * 4 for p in params)
    assert 1.0e6 < total < 1.2e6
    caps = {cap: torch_caps(cap) for cap in (0.15, 25)}  # lab latency's explicit caps
    plan = plan_buckets(params, caps[0.15][1], caps[0.15][0], close_at_cap=True)
    assert len(plan) == 7  # about five convolutions a bucket
    assert len(plan_buckets(params, caps[25][1], caps[25][0], close_at_cap=True)) == 1
