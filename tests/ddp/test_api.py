"""torch's constructor arguments, backward(create_graph=True), broadcast_buffers=False,
pickling, and DDP logging data, against torch DDP where torch defines the behaviour."""

from __future__ import annotations

import io
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from ddp import DistributedDataParallel
from tests.ddp.common import Deep, batches, case_tests, seeded, torch_pair, train_both, train_step

ATOL = 1e-6


def _constructor_arguments(rank: int, world: int) -> None:
    m = seeded(Deep)
    ddp = DistributedDataParallel(m, None, None, 1, False, batched_grad_copy=True)  # torch order
    assert ddp.dim == 1 and not ddp.broadcast_buffers
    DistributedDataParallel(m, device_ids=[])
    with pytest.raises(ValueError, match="device_ids and output_device arguments only work"):
        DistributedDataParallel(m, device_ids=[0])
    with pytest.raises(ValueError, match="device_ids and output_device arguments only work"):
        DistributedDataParallel(m, output_device=0)
    with pytest.warns(FutureWarning, match="check_reduction"):
        DistributedDataParallel(m, check_reduction=True)
    with pytest.raises(NotImplementedError, match=r"mixed_precision=.* does not implement"):
        DistributedDataParallel(m, mixed_precision=object())
    with pytest.raises(NotImplementedError, match="bucket_cap_mb_list"):
        DistributedDataParallel(m, bucket_cap_mb_list=[1, 2])
    with pytest.raises(TypeError, match="unknown argument bucket_cap=3"):
        DistributedDataParallel(m, bucket_cap=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DistributedDataParallel(m, mixed_precision=None, device_mesh=None)  # defaults: fine


class _Square(nn.Module):
    """torch's test_ddp_create_graph model."""

    def __init__(self) -> None:
        super().__init__()
        self.p = nn.Parameter(torch.tensor(1.0 + dist.get_rank()))

    def forward(self):
        return self.p.pow(2)


def _create_graph(rank: int, world: int) -> None:
    """backward(create_graph=True) runs the hooks in grad mode; the mean must still land in
    .grad, accumulated over iterations as torch does."""
    ours = DistributedDataParallel(_Square())
    theirs = nn.parallel.DistributedDataParallel(_Square())
    for _ in range(3):
        ours().backward(create_graph=True)
        theirs().backward(create_graph=True)
        torch.testing.assert_close(ours.module.p.grad, theirs.module.p.grad, atol=ATOL, rtol=0)
    assert ours.module.p.grad.requires_grad


class _RankBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(24, 4)
        self.register_buffer("mine", torch.full((3,), float(dist.get_rank())))

    def forward(self, x):
        return self.lin(x)


def _broadcast_buffers_false(rank: int, world: int) -> None:
    """torch 2.13: broadcast_buffers=False syncs buffers neither at construction nor in forward
    (rank-local buffers stay); forward_sync_buffers=False still syncs them at construction."""
    for cls in (DistributedDataParallel, nn.parallel.DistributedDataParallel):
        model = cls(seeded(_RankBuffer), broadcast_buffers=False)
        x, y = batches(rank, 1)[0]
        F.cross_entropy(model(x), y).backward()
        assert model.module.mine.tolist() == [float(rank)] * 3, cls
    synced = DistributedDataParallel(seeded(_RankBuffer), forward_sync_buffers=False)
    assert synced.module.mine.tolist() == [0.0] * 3


def _pickled(rank: int, world: int) -> None:
    """After torch.save/torch.load the wrapper averages again (its hooks are rebuilt), and a
    registered comm hook comes back with it."""
    for hook in (None, default_hooks.allreduce_hook):
        ours, theirs = torch_pair(Deep, hook)
        buf = io.BytesIO()
        torch.save(ours, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
        assert ("comm_hook" in loaded._get_ddp_logging_data()) == (hook is not None)
        train_both(loaded, theirs, rank, 3, ATOL, momentum=0.0, what="loaded, step")


def _logging_data(rank: int, world: int) -> None:
    """torch's keys, with torch's values where they are settings, and torch's sampling."""
    ours = DistributedDataParallel(seeded(Deep))
    theirs = nn.parallel.DistributedDataParallel(seeded(Deep))
    same = [
        "world_size",
        "rank",
        "module_name",
        "device_ids",
        "output_device",
        "backend_name",
        "bucket_cap_bytes",
        "find_unused_parameters",
        "gradient_as_bucket_view",
        "broadcast_buffers",
        "num_parameter_tensors",
        "total_parameter_size_bytes",
        "dtypes",
        "bucket_sizes",
        "has_sync_bn",
        "is_multi_device_module",
        "master_addr",
        "master_port",
        "torch_distributed_debug",
        "cuda_visible_devices",
        "gloo_socket_ifname",
        "iteration",
    ]
    o, t = ours._get_ddp_logging_data(), theirs._get_ddp_logging_data()
    assert {k: o.get(k) for k in same} == {k: t.get(k) for k in same}
    ours._set_ddp_runtime_logging_sample_rate(2)
    with pytest.raises(ValueError, match="sample rate should be equal or greater than 1"):
        ours._set_ddp_runtime_logging_sample_rate(0)
    opt = torch.optim.SGD(ours.parameters(), lr=0.1)
    for idx, (x, y) in enumerate(batches(rank, 14)):
        train_step(ours, opt, x, y)
        data = ours._get_ddp_logging_data()
        if idx > 0 and (idx < 10 or idx % 2 == 0):  # torch's test_ddp_logging_data rule
            assert data["iteration"] == idx
            for phase in ("forward_compute", "backward_compute", "backward_comm"):
                assert data[f"{phase}_time"] >= 1 and data[f"avg_{phase}_time"] >= 1, phase
            overlap = data["backward_compute_comm_overlap_time"]
            assert data["backward_compute_time"] >= overlap <= data["backward_comm_time"]
            assert data["backward_comm_time_end"] >= data["backward_comm_time_start"]
            assert data["backward_compute_time_start"] >= data["forward_compute_time_start"]
            assert data["unused_parameter_size"] == 0
        elif idx > 0:
            assert data["iteration"] != idx
    assert "comm_hook" not in data and "join_uneven_inputs" not in data


CASES = {
    "constructor_arguments": _constructor_arguments,
    "create_graph": _create_graph,
    "broadcast_buffers_false": _broadcast_buffers_false,
    "pickled": _pickled,
    "logging_data": _logging_data,
}


results, test_case_on_every_rank = case_tests(__name__, CASES)
