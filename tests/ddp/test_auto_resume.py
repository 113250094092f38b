"""--auto-resume: the same command line starts fresh, and after a kill resumes bitwise
identically; what torchrun --max-restarts needs from a restarted worker."""

from __future__ import annotations

import os
import signal

import pytest

from ddp.program.config import TrainConfig, flag_of
from ddp.program.records import load_attempts, load_run
from tests.ddp.test_faults import _end_hash, _wait_for_step
from tests.helpers import finish, train_ranks


def test_auto_resume_is_a_fault_flag_that_round_trips():
    cfg = TrainConfig(auto_resume=True, log_dir="/tmp/x", checkpoint_every=2)
    assert flag_of("auto_resume") == "--auto-resume"
    assert "--auto-resume" in cfg.to_argv()
    assert TrainConfig.__dataclass_fields__["auto_resume"].metadata["group"] == "fault"


def test_auto_resume_needs_a_checkpoint_directory():
    with pytest.raises(ValueError, match="--auto-resume need a directory"):
        TrainConfig(auto_resume=True)
    assert TrainConfig(auto_resume=True, checkpoint_dir="/c").checkpoints is not None


def test_resume_and_auto_resume_exclude_each_other():
    with pytest.raises(ValueError, match="--resume or --auto-resume"):
        TrainConfig(resume=True, auto_resume=True, log_dir="/l")


# Three ranks and several buckets: gloo's ring then sums each element in an order that depends
# on where it lies in its bucket, so the resumed run must rebuild the buckets the killed one had.
WORLD = 3


@pytest.mark.timeout(300)
def test_the_same_command_line_starts_fresh_then_resumes(tmp_path):
    args = [
        "--steps",
        "12",
        "--checkpoint-every",
        "3",
        "--collective-timeout",
        "20",
        "--model",
        "deep",
        "--bucket-cap-mb",
        "0.5",
        "--batch-size",
        "48",
    ]
    plain = train_ranks(tmp_path, WORLD, *args, "--log-dir", str(tmp_path / "plain"))
    plain = finish(plain, 120)
    assert "parity holds" in plain[0], plain

    logs = tmp_path / "auto"
    auto = [*args, "--log-dir", str(logs), "--auto-resume"]
    procs = train_ranks(tmp_path, WORLD, *auto, "--step-delay-ms", "100")
    _wait_for_step(logs / "rank1.jsonl", 7, procs)
    os.kill(procs[1].pid, signal.SIGKILL)
    first = finish(procs, timeout_s=40)
    assert "no complete checkpoint" in first[0] and "starting fresh" in first[0], first

    again = finish(train_ranks(tmp_path, WORLD, *auto), 120)  # exactly the same flags
    assert "resumed from" in again[0] and "(step 6)" in again[0], again
    assert "parity holds: 3 replicas identical after all 6 steps" in again[0], again
    killed, resumed = load_attempts(logs)[1]  # the restart keeps the killed attempt's log
    assert killed.config.start_step == 0 and killed.end is None
    assert killed.config.pid == procs[1].pid  # what a fault injector signals to hit rank 1
    assert resumed.config.start_step == 6 and load_run(logs)[1] == resumed
    for r in range(WORLD):
        assert _end_hash(logs / f"rank{r}.attempt1.jsonl") == _end_hash(
            tmp_path / "plain" / f"rank{r}.jsonl"
        )
