"""``--accumulate K`` and ``--wrapper torch`` through the training program itself, on spawned
gloo ranks: parity holds against the single process on the same global batch, and with K
micro-batches the flight recorder sees one step's bucket collectives per optimizer step, not K
(the first K-1 backwards ran under ``no_sync``)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from ddp.flight.recorder import FlightRecorder
from ddp.program.config import Rendezvous, TrainConfig
from ddp.program.loop import train
from ddp.program.records import RecordLog
from tests.helpers import run_ranks

STEPS = 3


def _rank(rdzv: Rendezvous, cfg: TrainConfig) -> dict[str, object]:
    dist.init_process_group(
        "gloo", init_method=rdzv.init_method, rank=rdzv.rank, world_size=rdzv.world_size
    )
    try:
        recorder = FlightRecorder(rdzv.rank, rdzv.world_size, capacity=4096)
        holds = train(cfg, rdzv.rank, rdzv.world_size, RecordLog(None, rdzv.rank), recorder)
        buckets = [r for r in recorder.records() if r.bucket is not None]
        per_step = {s: sum(1 for r in buckets if r.step == s) for s in range(1, STEPS + 1)}
        return {"holds": holds, "per_step": per_step}
    finally:
        dist.destroy_process_group()


def _run(tmp_path, **settings) -> dict[int, dict[str, object]]:
    torch.manual_seed(0)
    cfg = TrainConfig(**{"steps": STEPS, "model": "deep", "bucket_cap_mb": 0.05, **settings})
    tmp_path.mkdir(parents=True, exist_ok=True)
    return run_ranks(_rank, 2, tmp_path, cfg, timeout_s=200)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("model", ["deep", "branchy"])
def test_accumulation_holds_parity_and_syncs_once_per_step(tmp_path, model):
    one = _run(tmp_path / "k1", model=model)
    four = _run(tmp_path / "k4", model=model, accumulate=4)
    for res in (*one.values(), *four.values()):
        assert res["holds"] is True
    # the same buckets per optimizer step with 1 or 4 micro-batches: one sync per step
    assert four[0]["per_step"] == one[0]["per_step"]
    assert all(n > 0 for n in one[0]["per_step"].values())


@pytest.mark.timeout(300)
def test_torch_wrapper_holds_parity(tmp_path):
    results = _run(tmp_path, wrapper="torch", accumulate=2)
    assert all(res["holds"] is True for res in results.values())


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"accumulate": 0}, "--accumulate must be >= 1"),
        ({"wrapper": "tf"}, "--wrapper must be one of ours, torch"),
        ({"wrapper": "torch", "overlap": False}, "torch's DDP, which always overlaps"),
        ({"wrapper": "torch", "bucket_cap_mb": "auto"}, "no auto cap"),
        ({"bucket_cap_mb": "fast"}, "a finite number or auto"),
    ],
)
def test_bad_settings_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**settings)
