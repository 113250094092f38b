"""``bucket_cap_mb='auto'`` on spawned gloo ranks: every rank rebuilds with rank 0's choice at
the rebuild (the second synchronised forward), the replicas stay identical and within 1e-6 of
torch's DDP, and the choice is in ``_get_ddp_logging_data()``."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

from ddp.program.config import Rendezvous
from ddp.wrapper.auto_cap import CANDIDATE_CAPS_MB
from ddp.wrapper.auto_tune import wants_auto
from tests.ddp.common import Deep, torch_pair, train_both
from tests.helpers import run_ranks

STEPS = 4


def _rank(rdzv: Rendezvous) -> dict[str, object]:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=rdzv.init_method, rank=rdzv.rank, world_size=rdzv.world_size
    )
    try:
        ours, theirs = torch_pair(Deep, ours={"bucket_cap_mb": "auto"})
        before = ours.num_buckets
        train_both(ours, theirs, rdzv.rank, STEPS, 1e-6)
        data = ours._get_ddp_logging_data()
        params = torch.cat([p.detach().flatten() for p in ours.parameters()]).tolist()
        return {
            "before": before,
            "cap": ours.bucket_cap_mb,
            "buckets": ours.num_buckets,
            "logged": json.loads(data["auto_bucket_cap"]),
            "params": params,
        }
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_ranks(_rank, 3, tmp_path_factory.mktemp("rdzv"), timeout_s=200)


@pytest.mark.timeout(300)
def test_every_rank_takes_rank0_choice_and_stays_identical(results):
    first = results[0]
    assert first["before"] == 1  # torch's first iteration: one bucket
    assert first["cap"] in CANDIDATE_CAPS_MB
    assert first["logged"]["cap_mb"] == first["cap"]
    assert set(first["logged"]["predicted_ms"]) == {str(c) for c in CANDIDATE_CAPS_MB}
    assert first["logged"]["call_cpu_ms"] > 0  # gloo's workers spend CPU on every call
    for res in results.values():
        assert (res["cap"], res["buckets"], res["logged"]) == (
            first["cap"],
            first["buckets"],
            first["logged"],
        )
        assert res["params"] == first["params"]


def test_auto_with_find_unused_parameters_is_refused():
    with pytest.raises(ValueError, match="find_unused_parameters=True never"):
        wants_auto("auto", find_unused_parameters=True)
    assert wants_auto(5.0, find_unused_parameters=True) == (False, 5.0)
    assert wants_auto("auto", find_unused_parameters=False) == (True, None)
