"""The commands a user types: python -m ddp, python -m ddp train (what containers run), torchrun."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ddp import DistributedDataParallel
from ddp.records import StepRecord, read_rank_log
from tests.helpers import finish, train_ranks

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _ddp(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ddp", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
    )


@pytest.mark.timeout(150)
def test_local_run_prints_table_and_parity_verdict(tmp_path):
    r = _ddp(
        "--world-size",
        "2",
        "--steps",
        "3",
        "--model",
        "deep",
        "--bucket-cap-mb",
        "0.1",
        "--log-dir",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1].startswith("parity holds: 2 replicas identical after all 3 steps")
    rows = [line.split()[0] for line in lines if line.startswith("    ")]
    assert rows == ["1", "2", "3"]  # the table: one row per step
    log = read_rank_log(tmp_path / "rank1.jsonl")
    assert [s.step for s in log.steps] == [1, 2, 3]
    assert all(isinstance(s, StepRecord) and s.step_ms > 0 for s in log.steps)
    assert log.end is not None and log.end.parity and not log.torn
    assert "@ddp" not in r.stdout  # records go to stdout only when asked (--emit-records)


@pytest.mark.timeout(150)
def test_barrier_sync_breaks_parity():
    r = _ddp("--world-size", "2", "--steps", "2", "--sync", "barrier")
    assert r.returncode == 1
    assert "parity broken: replicas diverged at step 1" in r.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--world-size", "4", "--batch-size", "10"], "not divisible by the world size 4"),
        (["--bucket-cap-mb", "-1"], "--bucket-cap-mb must be a number >= 0"),
        (["--model", "resnet"], "invalid choice"),
        (["--world-size", "0"], "--world-size must be >= 1"),
        (["train", "--rank", "0"], "pass all of --rank, --world-size and --init-method"),
    ],
)
def test_bad_arguments_exit_2_with_a_reason(args, message):
    r = _ddp(*args, timeout=60)
    assert r.returncode == 2
    assert message in r.stderr


def test_train_without_rendezvous_says_how(monkeypatch):
    env = {k: v for k, v in ENV.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}
    r = subprocess.run(
        [sys.executable, "-m", "ddp", "train"], capture_output=True, text=True, timeout=60, env=env
    )
    assert r.returncode == 2
    assert "under torchrun" in r.stderr


@pytest.mark.timeout(150)
def test_externally_launched_ranks(tmp_path):
    """What each container runs: one process per rank on a shared file:// rendezvous."""
    procs = train_ranks(tmp_path, 2, "--steps", "3", "--collective-timeout", "60")
    outs = finish(procs, timeout_s=120)
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "parity holds" in outs[0]
    assert outs[1] == ""  # rank 1 stays quiet


@pytest.mark.timeout(150)
def test_torchrun_env_rendezvous():
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            "29517",
            "-m",
            "ddp",
            "train",
            "--steps",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert r.returncode == 0, r.stderr
    assert "parity holds: 2 replicas identical" in r.stdout


def test_wrapper_needs_a_process_group():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        DistributedDataParallel(nn.Linear(2, 2))


def test_world_size_one_and_bad_cap(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rdzv", rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="bucket_cap_mb must be >= 0, got -1"):
            DistributedDataParallel(nn.Linear(2, 2), bucket_cap_mb=-1)
        model = nn.Linear(3, 1)
        ddp = DistributedDataParallel(model)
        x = torch.ones(2, 3)
        ddp(x).sum().backward()
        assert model.weight.grad.tolist() == x.sum(0, keepdim=True).tolist()
        sparse = DistributedDataParallel(nn.Embedding(10, 3, sparse=True))
        with pytest.raises(RuntimeError, match="sparse gradient"):
            sparse(torch.tensor([1, 2])).sum().backward()
    finally:
        dist.destroy_process_group()
