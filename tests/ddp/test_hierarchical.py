"""The two-level allreduce hook on spawned gloo ranks told which node they are on (``DDP_NODE``):
2 nodes x 2, 1 x 4, 4 x 1, 3 x 1, and 2 + 1. Under our wrapper and under torch's, it must leave
the replicas bitwise identical and the parameters within 1e-6 of torch's DDP with its flat
allreduce; the fp16 variant compresses only the cross-node leg, so the replicas still agree
bitwise and the difference from exact is fp16's rounding."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from ddp import DistributedDataParallel
from ddp.program.config import Rendezvous
from ddp.wrapper.hierarchical import register_hierarchical
from ddp.wrapper.topology import NODE_ENV, Topology
from tests.ddp.common import Deep, batches, seeded
from tests.helpers import run_ranks

STEPS = 4
# name -> ranks per node, in rank order (the node names every rank reports)
# (2+1: nodes of unequal size work too, the leader variant needs no equal shards)
LAYOUTS = {"2x2": [2, 2], "1x4": [4], "4x1": [1, 1, 1, 1], "3x1": [1, 1, 1], "2+1": [2, 1]}


def _node_names(sizes: list[int]) -> list[str]:
    return [f"node{n}" for n, size in enumerate(sizes) for _ in range(size)]


def _train(wrapper: type, hook: str | None) -> tuple[list[float], object]:
    model = wrapper(seeded(Deep), bucket_cap_mb=0.001)  # several buckets, several threads' worth
    state = None
    if hook is not None:
        dtype = torch.float16 if hook == "fp16" else None
        state = register_hierarchical(model, cross_dtype=dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches(dist.get_rank(), STEPS):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    # plain floats cross the process boundary (tensors would travel as shared-memory handles
    # that die with the rank); float32 -> float is exact, so equality stays bitwise
    return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist(), state


def _rank(rdzv: Rendezvous, sizes: list[int]) -> dict[str, object]:
    torch.set_num_threads(1)
    os.environ[NODE_ENV] = _node_names(sizes)[rdzv.rank]
    dist.init_process_group(
        "gloo", init_method=rdzv.init_method, rank=rdzv.rank, world_size=rdzv.world_size
    )
    try:
        flat, _ = _train(TorchDDP, None)
        out: dict[str, object] = {"flat": flat}
        for name, wrapper in (("ours", DistributedDataParallel), ("torch", TorchDDP)):
            for hook in ("exact", "fp16"):
                params, state = _train(wrapper, hook)
                out[f"{name}-{hook}"] = params
                out["hooked"] = state is not None
        return out
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module", params=list(LAYOUTS))
def layout(request, tmp_path_factory):
    sizes = LAYOUTS[request.param]
    rdzv = tmp_path_factory.mktemp("rdzv")
    return sizes, run_ranks(_rank, sum(sizes), rdzv, sizes, timeout_s=200)


@pytest.mark.timeout(300)
def test_replicas_identical_and_exact_variant_matches_flat(layout):
    _, results = layout
    flat = torch.tensor(results[0]["flat"])
    for key in ("ours-exact", "torch-exact", "ours-fp16", "torch-fp16"):
        for rank, res in results.items():
            assert res[key] == results[0][key], f"{key}: rank {rank} differs from rank 0"
    exact = {"ours-exact": 1e-6, "torch-exact": 1e-6, "ours-fp16": 1e-2, "torch-fp16": 1e-2}
    for key, atol in exact.items():
        got = torch.tensor(results[0][key])
        torch.testing.assert_close(got, flat, atol=atol, rtol=0, msg=lambda m, k=key: f"{k}: {m}")
    # the same hook under both wrappers computes the same thing
    torch.testing.assert_close(
        torch.tensor(results[0]["ours-fp16"]),
        torch.tensor(results[0]["torch-fp16"]),
        atol=1e-6,
        rtol=0,
    )


def test_hook_registered_only_where_two_levels_help(layout):
    sizes, results = layout
    two_levels = len(sizes) > 1 and len(sizes) < sum(sizes)
    assert all(res["hooked"] == two_levels for res in results.values())


def test_topology_from_names_groups_and_orders_by_lowest_rank():
    topo = Topology.from_names(["b", "a", "b", "a", "c"])
    assert topo.nodes == ((0, 2), (1, 3), (4,))
    assert topo.leaders == (0, 1, 4)
    assert not topo.is_flat and topo.describe() == "3 nodes x 2/2/1 ranks"
    assert Topology.from_names(["x"] * 4).is_flat
    assert Topology.from_names(["a", "b", "c"]).is_flat
    with pytest.raises(ValueError, match=r"ranks 0\.\.N-1"):
        Topology(((0, 2),))
