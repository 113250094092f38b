"""Pure logic: the bucket plan (no process group)."""

import pytest
import torch

from ddp.buckets import FIRST_BUCKET_CAP_BYTES, plan_buckets

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
