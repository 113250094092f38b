"""Under torch.distributed.autograd the gradients go to a context, not .grad, and the
per-parameter post-accumulate hooks do not fire; the reducer's accumulator hooks do, and the
context's gradients must come out averaged, equal to a local backward's (torch's
ddp_under_dist_autograd DdpComparisonTest), with and without uneven inputs, and for a sparse
embedding's gradient too."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from torch import nn

from ddp import DistributedDataParallel
from ddp.program.config import Rendezvous
from tests.helpers import run_ranks

pytestmark = pytest.mark.skipif(not rpc.is_available(), reason="torch built without RPC")


def _compare(rdzv: Rendezvous, uneven: bool, sparse: bool) -> str:
    torch.set_num_threads(1)
    torch.manual_seed(rdzv.rank)  # different weights and inputs per rank: averaging shows
    dist.init_process_group(
        "gloo", init_method=rdzv.init_method, rank=rdzv.rank, world_size=rdzv.world_size
    )
    rpc_file = os.path.join(os.path.dirname(rdzv.init_method.removeprefix("file://")), "rpc")
    rpc.init_rpc(
        f"worker{rdzv.rank}",
        rank=rdzv.rank,
        world_size=rdzv.world_size,
        rpc_backend_options=rpc.TensorPipeRpcBackendOptions(init_method=f"file://{rpc_file}"),
    )
    try:
        net = nn.EmbeddingBag(10, 3, sparse=True) if sparse else nn.Linear(2, 3)
        ddp = DistributedDataParallel(net)
        n = 1 + (2 if uneven and rdzv.rank == 0 else 0)
        if sparse:  # (indices, offsets): two bags of a rank's own random rows
            inputs = [(torch.randint(0, 10, (10,)), torch.tensor([0, 4])) for _ in range(n)]
        else:
            inputs = [(torch.rand(3, 2),) for _ in range(n)]
        with ddp.join(uneven):
            for i, x in enumerate(inputs):
                with dist_autograd.context() as context_id:
                    dist_autograd.backward(context_id, [ddp(*x).norm()])
                    grads = dist_autograd.get_gradients(context_id)
                ddp.zero_grad()
                ddp(*x).norm().backward()
                for p in net.parameters():
                    assert p in grads, f"iteration {i}: no context gradient"
                    assert grads[p].is_sparse == sparse
                    torch.testing.assert_close(grads[p], p.grad, atol=1e-6, rtol=0)
        return "ok"
    finally:
        rpc.shutdown()
        dist.destroy_process_group()


@pytest.mark.timeout(200)
@pytest.mark.parametrize("uneven", [False, True])
@pytest.mark.parametrize("sparse", [False, True])
def test_context_gradients_are_averaged(tmp_path, uneven, sparse):
    results = run_ranks(_compare, 2, tmp_path, uneven, sparse, timeout_s=150)
    assert results == {0: "ok", 1: "ok"}
