"""Pure logic: configuration validation, the parity judge and the offline log check."""

import json

import pytest

from ddp.config import Rendezvous, TrainConfig
from ddp.parity import StepRow, check_logs, table_row_step


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"steps": 0}, "steps"),
        ({"batch_size": 0}, "batch_size"),
        ({"bucket_cap_mb": -1}, "bucket_cap_mb"),
        ({"bucket_cap_mb": float("nan")}, "bucket_cap_mb"),
        ({"model": "resnet"}, "model"),
        ({"sync": "gossip"}, "sync"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"backward_delay_ms": -1}, "backward_delay_ms"),
        ({"checkpoint_every": 2}, "checkpoint-dir"),
    ],
)
def test_bad_config_names_the_value(kwargs, word):
    with pytest.raises(ValueError, match=word):
        TrainConfig(**kwargs)


def test_batch_must_split_evenly():
    with pytest.raises(ValueError, match="not divisible by world size 4"):
        TrainConfig(batch_size=10).local_batch(4)


def test_rendezvous_from_torchrun_env():
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert Rendezvous.from_env(env) == Rendezvous(1, 2, "env://")
    with pytest.raises(ValueError, match="MASTER_PORT"):
        Rendezvous.from_env({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "x"})
    with pytest.raises(ValueError, match="rank"):
        Rendezvous(3, 2, "env://")


def test_table_row_is_recognised():
    row = StepRow(
        step=7,
        loss=2.0,
        checksums=[1.0, 1.0],
        ref_loss=2.0,
        ref_checksum=1.0,
        max_param_diff=0.0,
        step_ms=3.0,
        comm_ms=1.0,
    )
    assert table_row_step(row.format()) == 7
    assert table_row_step("[node0/rank0] " + row.format()) == 7
    assert table_row_step("4 ranks, model mini, 1 buckets") is None
    assert table_row_step("parity holds: 4 replicas identical") is None


def _write_run(tmp_path, world, steps, *, diverge_at=None, ref_diff=1e-8, torn=False):
    for rank in range(world):
        lines = [
            json.dumps(
                {
                    "event": "config",
                    "rank": rank,
                    "world_size": world,
                    "steps": steps,
                    "tolerance": 1e-5,
                }
            )
        ]
        for s in range(1, steps + 1):
            rec = {
                "event": "step",
                "rank": rank,
                "step": s,
                "loss": 1.0 / s,
                "checksum": 10.0 + s + (rank * 1e-3 if diverge_at and s >= diverge_at else 0),
                "step_ms": 5.0,
                "comm_ms": 1.0,
            }
            if rank == 0:
                rec.update(ref_loss=1.0 / s, ref_checksum=10.0 + s, max_param_diff=ref_diff)
            lines.append(json.dumps(rec))
        text = "\n".join(lines) + "\n"
        if torn and rank == 1:
            text += '{"event": "step", "ra'
        (tmp_path / f"rank{rank}.jsonl").write_text(text)


def test_check_logs_holds(tmp_path):
    _write_run(tmp_path, 3, 4, torn=True)
    report = check_logs(tmp_path)
    assert report.holds, report.verdict
    assert report.verdict.startswith("parity holds: 3 replicas identical after all 4 steps")
    assert len(report.table().splitlines()) == 5


def test_check_logs_detects_divergence_reference_gap_and_missing_rank(tmp_path):
    _write_run(tmp_path, 2, 4, diverge_at=3)
    assert check_logs(tmp_path).verdict.startswith("parity broken: replicas diverged at step 3")
    _write_run(tmp_path, 2, 4, ref_diff=1e-3)
    assert "differ from the single-process reference" in check_logs(tmp_path).verdict
    _write_run(tmp_path, 3, 4)
    (tmp_path / "rank2.jsonl").unlink()
    assert "no log from rank 2" in check_logs(tmp_path).verdict


def test_check_logs_without_logs_says_what_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"rank\*\.jsonl"):
        check_logs(tmp_path)
