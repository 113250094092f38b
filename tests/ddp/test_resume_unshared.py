"""Resuming without a directory every rank shares (hosts with a volume each): the ranks agree
on the newest checkpoint any of them sees and its holder broadcasts the state, so a rank 0
whose directory is empty still resumes, bitwise where an uninterrupted run ends."""

from __future__ import annotations

import os
import signal

import pytest

from tests.ddp.test_faults import _end_hash, _wait_for_step
from tests.helpers import finish, train_ranks

WORLD = 2
ARGS = ["--steps", "8", "--collective-timeout", "20", "--model", "deep", "--batch-size", "32"]


def _ranks(tmp_path, per_rank):
    """One ``python -m ddp train`` per rank, each with its own extra flags."""
    return train_ranks(tmp_path, WORLD, *ARGS, per_rank=per_rank)


@pytest.mark.timeout(300)
def test_a_rank_without_the_checkpoint_gets_it_from_the_rank_that_has_it(tmp_path):
    plain = finish(train_ranks(tmp_path, WORLD, *ARGS, "--log-dir", str(tmp_path / "plain")), 120)
    assert "parity holds" in plain[0], plain

    # rank 0 checkpoints every 2 steps into its own directory; killed in step 6
    first = tmp_path / "first"
    procs = train_ranks(
        tmp_path,
        WORLD,
        *ARGS,
        "--log-dir",
        str(first),
        "--checkpoint-every",
        "2",
        "--step-delay-ms",
        "100",
    )
    _wait_for_step(first / "rank1.jsonl", 5, procs)
    os.kill(procs[1].pid, signal.SIGKILL)
    finish(procs, timeout_s=40)

    # now rank 0 (a new host's) sees an empty directory, rank 1 sees the checkpoints
    empty, logs = tmp_path / "empty", [tmp_path / "again0", tmp_path / "again1"]
    again = finish(
        _ranks(
            tmp_path,
            [
                ["--log-dir", str(logs[0]), "--checkpoint-dir", str(empty), "--resume"],
                [
                    "--log-dir",
                    str(logs[1]),
                    "--checkpoint-dir",
                    str(first / "checkpoints"),
                    "--resume",
                ],
            ],
        ),
        120,
    )
    assert "resumed from rank 1's" in again[0] and "(step 4)" in again[0], again
    assert "parity holds: 2 replicas identical after all 4 steps" in again[0], again
    plain_sha = _end_hash(tmp_path / "plain" / "rank0.jsonl")
    assert _end_hash(logs[0] / "rank0.jsonl") == _end_hash(logs[1] / "rank1.jsonl") == plain_sha
