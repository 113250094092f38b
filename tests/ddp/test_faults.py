"""Faults on one host with real ranks: a rank SIGKILLed or SIGSTOPped mid-run, and resuming
from checkpoints. The survivors must name the missing rank (not print a bare gloo error)
within the collective timeout plus slack, and a resumed run must end bitwise identical."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from ddp.program.checkpoint import checkpoint_path, list_checkpoints
from ddp.program.config import DEFAULT_RUN_ID
from ddp.program.records import load_attempts, read_rank_log
from tests.helpers import finish, train_ranks

WORLD = 3
VICTIM = 2
TIMEOUT_S = 5


def _step_reached(log: Path, step: int) -> bool:
    try:
        return any(s.step == step for s in read_rank_log(log).steps)
    except FileNotFoundError:
        return False


def _wait_for_step(log: Path, step: int, procs: list, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not _step_reached(log, step):
        exited = [p for p in procs if p.poll() is not None]
        assert not exited, f"a rank exited early:\n{exited[0].communicate()[0]}"
        assert time.monotonic() < deadline, f"{log} never reached step {step}"
        time.sleep(0.02)


def _end_hash(log: Path) -> str:
    end = read_rank_log(log).end
    assert end is not None, log.read_text()[-300:]
    return end.params_sha256


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["kill", "stop"])
def test_survivors_name_the_missing_rank(tmp_path, sig):
    logs = tmp_path / "logs"
    procs = train_ranks(
        tmp_path,
        WORLD,
        "--steps",
        "40",
        "--step-delay-ms",
        "100",
        "--batch-size",
        "48",
        "--collective-timeout",
        str(TIMEOUT_S),
        "--log-dir",
        str(logs),
    )
    try:
        # The victim logged step 3, so the fault lands during its step 4.
        _wait_for_step(logs / f"rank{VICTIM}.jsonl", 3, procs)
        os.kill(procs[VICTIM].pid, sig)
        hit = time.monotonic()
        survivors = [p for r, p in enumerate(procs) if r != VICTIM]
        for p in survivors:
            p.wait(timeout=TIMEOUT_S + 20)
        took = time.monotonic() - hit
    finally:
        outs = finish(procs, timeout_s=5)
    for r, (p, out) in enumerate(zip(procs, outs, strict=True)):
        if r == VICTIM:
            continue
        assert p.returncode == 3, out
        assert f"diagnosis: rank {VICTIM} missing at step 4" in out, out
    # kill is noticed at once by the victim's neighbours; stop only at the timeout
    assert took < TIMEOUT_S + 10


@pytest.mark.timeout(200)
def test_resume_after_a_kill_is_bitwise_identical(tmp_path):
    args = ["--steps", "12", "--checkpoint-every", "3", "--collective-timeout", "20"]
    plain = finish(train_ranks(tmp_path, 2, *args, "--log-dir", str(tmp_path / "plain")), 90)
    assert "parity holds" in plain[0], plain

    logs = tmp_path / "faulty"
    procs = train_ranks(tmp_path, 2, *args, "--log-dir", str(logs), "--step-delay-ms", "100")
    _wait_for_step(logs / "rank1.jsonl", 7, procs)
    os.kill(procs[1].pid, signal.SIGKILL)
    finish(procs, timeout_s=40)
    assert [s for s, _ in list_checkpoints(logs / "checkpoints", DEFAULT_RUN_ID)] == [3, 6]

    resumed = finish(train_ranks(tmp_path, 2, *args, "--log-dir", str(logs), "--resume"), 90)
    assert "resumed from" in resumed[0] and "(step 6)" in resumed[0], resumed
    assert "parity holds: 2 replicas identical after all 6 steps" in resumed[0], resumed
    # The resumed ranks keep the killed attempt's logs and write their own beside them.
    assert [log.attempt for log in load_attempts(logs)[0]] == [0, 1]
    assert _end_hash(logs / "rank0.attempt1.jsonl") == _end_hash(tmp_path / "plain" / "rank0.jsonl")


@pytest.mark.timeout(120)
def test_resume_skips_a_truncated_checkpoint(tmp_path):
    logs = tmp_path / "logs"
    args = ["--steps", "4", "--checkpoint-every", "2", "--log-dir", str(logs)]
    finish(train_ranks(tmp_path, 2, *args), 60)
    newest = checkpoint_path(logs / "checkpoints", 4, DEFAULT_RUN_ID)
    newest.write_bytes(newest.read_bytes()[:-100])  # a write cut short
    out = finish(train_ranks(tmp_path, 2, *args, "--resume"), 60)
    assert "skipping corrupt checkpoint" in out[0] or "(step 2)" in out[0], out
    assert "resumed from" in out[0] and "(step 2)" in out[0], out


def test_resume_without_checkpoint_is_a_clear_error(tmp_path):
    out = finish(train_ranks(tmp_path, 1, "--resume", "--log-dir", str(tmp_path)), 60)
    assert "no complete checkpoint in" in out[0], out
