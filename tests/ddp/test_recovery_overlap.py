"""The Manager's gradient allreduces, without ranks: the plan is a function of the model
alone, every chunk goes out as soon as its gradients are in (during backward, not after
it), the collectives are the same whatever the wrapper's buckets, and an abort frees the
wrapper at once without letting a late result write into the next step's gradients."""

from __future__ import annotations

import contextlib
import threading

import torch
from torch import nn

from ddp.recovery.api import _chunk_plan, _StepReduce
from ddp.recovery.protocol.waiting import QuorumLost


class _Bucket:
    """What the hook reads of a ``dist.GradBucket``: its parameters and gradient views."""

    def __init__(self, index: int, params: list[nn.Parameter], last: bool) -> None:
        self._index, self._params, self._last = index, params, last
        self._buffer = torch.cat([p.grad.reshape(-1) for p in params])
        self._views, offset = [], 0
        for p in params:
            self._views.append(self._buffer[offset : offset + p.numel()].view_as(p))
            offset += p.numel()

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return self._last

    def parameters(self) -> list[nn.Parameter]:
        return self._params

    def gradients(self) -> list[torch.Tensor]:
        return self._views

    def buffer(self) -> torch.Tensor:
        return self._buffer


class _Group:
    """Records each allreduce's size; completes it only when the test says (a sum over two
    identical replicas: the tensor doubled)."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.pending: list[tuple[torch.Tensor, torch.futures.Future]] = []

    def allreduce(self, tensors: list[torch.Tensor]):
        fut: torch.futures.Future = torch.futures.Future()
        self.sizes.append(tensors[0].numel())
        self.pending.append((tensors[0], fut))

        class _Work:
            def get_future(self):
                return fut

        return _Work()

    def complete_all(self) -> None:
        for t, fut in self.pending:
            t.mul_(2)
            fut.set_result([t])
        self.pending = []


class _Member:
    def __init__(self) -> None:
        self.abort = None
        self.wakers: set = set()

    @contextlib.contextmanager
    def waking(self, ev: threading.Event):
        self.wakers.add(ev)
        try:
            yield
        finally:
            self.wakers.discard(ev)

    def post(self, why: str) -> None:
        self.abort = {"by": "rank 1", "why": why}
        for ev in list(self.wakers):
            ev.set()


class _Manager:
    def __init__(self, model: nn.Module) -> None:
        self._index = {id(p): i for i, p in enumerate(model.parameters())}
        self._plan = _chunk_plan(model)
        self._weight, self._error = 0.5, None
        self.member, self.group = _Member(), _Group()


def _tower(cap_bytes: int) -> nn.Module:
    """Four 64x64 layers (16 KiB a weight) and a wrapper's caps: one chunk per layer."""
    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)])
    model.bucket_bytes_cap, model.bucket_bytes_cap_default = cap_bytes, False
    for p in model.parameters():
        p.grad = torch.full_like(p, 1.0)
    return model


def _buckets(model: nn.Module, layout: list[list[int]]) -> list[_Bucket]:
    params = list(model.parameters())
    return [
        _Bucket(i, [params[j] for j in idx], i == len(layout) - 1) for i, idx in enumerate(layout)
    ]


BY_LAYER = [[6, 7], [4, 5], [2, 3], [0, 1]]  # backward's order: the last layer first
ONE_BUCKET = [[7, 6, 5, 4, 3, 2, 1, 0]]  # a wrapper that has not rebuilt its buckets yet


def test_plan_follows_the_wrappers_caps_in_reverse_order():
    assert _chunk_plan(_tower(64 * 64 * 4 + 64 * 4)) == [[7, 6], [5, 4], [3, 2], [1, 0]]
    assert _chunk_plan(_tower(1 << 30)) == [[7, 6, 5, 4, 3, 2, 1, 0]]
    frozen = _tower(1 << 30)
    frozen[0].weight.requires_grad_(False)
    assert 0 not in _chunk_plan(frozen)[0]


def test_each_chunk_goes_out_while_backward_goes_on():
    model = _tower(64 * 64 * 4 + 64 * 4)
    m = _Manager(model)
    step = _StepReduce(m)
    futs = []
    for n, bucket in enumerate(_buckets(model, BY_LAYER), start=1):
        futs.append(step.add(bucket))
        assert len(m.group.sizes) == n  # issued before the next bucket arrives
    assert not any(f.done() for f in futs)
    m.group.complete_all()
    assert all(f.done() for f in futs)
    for p in model.parameters():  # weighted by 0.5, summed over two: the mean
        torch.testing.assert_close(p.grad, torch.ones_like(p))


def test_the_same_collectives_whatever_the_wrappers_buckets():
    model = _tower(64 * 64 * 4 + 64 * 4)
    rebuilt, fresh = _Manager(model), _Manager(model)
    a, b = _StepReduce(rebuilt), _StepReduce(fresh)
    for bucket in _buckets(model, BY_LAYER):
        a.add(bucket)
    for bucket in _buckets(model, ONE_BUCKET):
        b.add(bucket)
    assert rebuilt.group.sizes == fresh.group.sizes == [64 * 64 + 64] * 4


def test_an_abort_frees_the_wrapper_and_a_late_result_writes_nothing():
    model = _tower(64 * 64 * 4 + 64 * 4)
    m = _Manager(model)
    step = _StepReduce(m)
    buckets = _buckets(model, BY_LAYER)
    first = step.add(buckets[0])
    m.member.post("rank 2 is gone")
    assert first.done() and isinstance(m._error, QuorumLost)
    rest = [step.add(b) for b in buckets[1:]]
    assert all(f.done() for f in rest) and len(m.group.sizes) == 1
    before = [g.clone() for g in buckets[0].gradients()]
    m.group.complete_all()  # the lost peer's allreduce ends after all
    for g, was in zip(buckets[0].gradients(), before, strict=True):
        torch.testing.assert_close(g, was)


def test_a_late_result_writes_nothing_even_when_a_bucket_is_a_chunk():
    """The tempting shortcut, reducing a bucket that is exactly a chunk in place, would hand
    gloo the wrapper's own buffer: an abandoned allreduce that ends after the abort would then
    write into the next step's gradients. The chunk is always a copy."""
    model = _tower(1 << 30)
    m = _Manager(model)
    step = _StepReduce(m)
    (bucket,) = _buckets(model, ONE_BUCKET)
    assert m._plan == ONE_BUCKET
    fut = step.add(bucket)
    assert m.group.pending[0][0].data_ptr() != bucket.buffer().data_ptr()
    m.member.post("rank 2 is gone")
    assert fut.done()
    before = bucket.buffer().clone()
    m.group.complete_all()
    torch.testing.assert_close(bucket.buffer(), before)
