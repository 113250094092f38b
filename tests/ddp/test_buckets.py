"""Pure logic: the bucket plan (no process group)."""

import pytest
import torch

from ddp.wrapper.buckets import FIRST_BUCKET_CAP_BYTES, plan_buckets, torch_caps, torch_initial_plan

MB = 1 << 20


def _params(*sizes, dtype=torch.float32):
    return [torch.empty(n, dtype=dtype) for n in sizes]


def test_cap_zero_is_one_bucket_per_tensor_in_reverse_order():
    plan = plan_buckets(_params(10, 20, 30), 0)
    assert [b.indices for b in plan] == [(2,), (1,), (0,)]


def test_buckets_respect_cap_and_reverse_order():
    # 6 tensors of 1 MB each (float32: 262144 elements), cap 2 MB, no small first bucket
    ps = _params(*([262144] * 6))
    plan = plan_buckets(ps, 2 * MB, first_cap_bytes=None)
    assert [b.indices for b in plan] == [(5, 4), (3, 2), (1, 0)]
    assert all(b.nbytes <= 2 * MB for b in plan)


def test_first_bucket_is_small_so_communication_starts_early():
    ps = _params(*([131072] * 8))  # 0.5 MB each
    plan = plan_buckets(ps, 25 * MB)
    assert plan[0].nbytes <= FIRST_BUCKET_CAP_BYTES
    assert [b.indices for b in plan] == [(7, 6), (5, 4, 3, 2, 1, 0)]


def test_oversized_tensor_gets_its_own_bucket():
    plan = plan_buckets(_params(10, 10_000_000, 10), 1 * MB, first_cap_bytes=None)
    assert [b.indices for b in plan] == [(2,), (1,), (0,)]


def test_one_dtype_per_bucket_and_every_param_exactly_once():
    ps = [torch.empty(8), torch.empty(8, dtype=torch.float64), torch.empty(8), torch.empty(4)]
    plan = plan_buckets(ps, 25 * MB)
    for b in plan:
        assert {ps[i].dtype for i in b.indices} == {b.dtype}
    assert sorted(i for b in plan for i in b.indices) == [0, 1, 2, 3]
    assert [b.indices for b in plan] == [(3, 2, 0), (1,)]


def test_plan_is_deterministic():
    ps = _params(*range(1, 200))
    assert plan_buckets(ps, 300) == plan_buckets(ps, 300)


def test_negative_cap_is_rejected():
    with pytest.raises(ValueError, match="cap_bytes"):
        plan_buckets(_params(1), -1)


def test_an_explicit_order_is_walked_as_given():
    # the rebuilt plan: gradients arrived first-registered first
    ps = _params(*([262144] * 4))  # 1 MB each
    plan = plan_buckets(ps, 2 * MB, first_cap_bytes=None, order=[0, 1, 2, 3])
    assert [b.indices for b in plan] == [(0, 1), (2, 3)]


def test_an_order_that_is_not_a_permutation_is_rejected():
    with pytest.raises(ValueError, match="permutation of range\\(3\\)"):
        plan_buckets(_params(1, 2, 3), 0, order=[0, 0, 2])


def test_torch_initial_plan_puts_the_small_bucket_last():
    ps = _params(*([131072] * 12))  # 0.5 MB each; first cap 1 MB, cap 2 MB
    plan = torch_initial_plan(ps, (1 * MB, 2 * MB), one_bucket=False)
    assert [b.indices for b in plan] == [(10, 11), (6, 7, 8, 9), (2, 3, 4, 5), (0, 1)]


def test_torch_first_iteration_is_one_bucket_per_dtype():
    ps = [torch.empty(8), torch.empty(8, dtype=torch.float64), torch.empty(8)]
    plan = torch_initial_plan(ps, (0, 0), one_bucket=True)
    assert sorted(b.indices for b in plan) == [(0, 2), (1,)]


def test_torch_caps_small_first_bucket_only_by_default():
    assert torch_caps(None) == (FIRST_BUCKET_CAP_BYTES, 25 * MB)
    assert torch_caps(4) == (4 * MB, 4 * MB)
    assert torch_caps(0) == (0, 0)
