"""Resume picks this run's state or none: another configuration's checkpoint is refused in one
line (exit 2) unless forced, an unloadable newest checkpoint is skipped for the one before, a
stale volume on one host does not decide for the others, and a killed writer's temp file goes
while a live writer's stays."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from torch import nn

from ddp.program.checkpoint import (
    TEMP_MAX_AGE_S,
    _host,
    checkpoint_path,
    read_checkpoint,
    remove_stale_temp_files,
    save_checkpoint,
)
from ddp.program.config import TrainConfig
from ddp.program.models import build_model
from ddp.program.optimizer import build_optimizer
from ddp.program.resume import _load, fingerprint_difference, run_fingerprint
from tests.ddp.test_faults import _end_hash
from tests.helpers import finish, run_ddp, train_ranks


def _fingerprint(**changes) -> dict:
    cfg = TrainConfig(**changes)
    module = build_model(cfg.model, cfg.seed)
    return run_fingerprint(cfg, module, build_optimizer(module, cfg))


def test_the_fingerprint_holds_what_makes_a_state_wrong_and_nothing_else():
    base = _fingerprint()
    # same state, other speed or reporting, or a longer run: the same run
    for same in (
        {"bucket_cap_mb": 1.0},
        {"overlap": False},
        {"wrapper": "torch"},
        {"steps": 50},
        {"backward_delay_ms": 5.0},
        {"reference": False},
        {"tolerance": 1e-3},
    ):
        assert fingerprint_difference(base, _fingerprint(**same)) == "", same
    differ = {
        "model": "deep",
        "seed": 7,
        "batch_size": 32,
        "accumulate": 2,
        "lr": 0.5,
        "momentum": 0.0,
        "sync": "none",
        "comm_hook": "fp16",
    }
    for name, value in differ.items():
        theirs = _fingerprint(**{name: value})
        text = fingerprint_difference(base, theirs)
        flag = "--" + name.replace("_", "-")
        assert text.startswith(f"{flag} {base[name]} here, {value} in the checkpoint"), text
    assert "optimizer" in base and base["optimizer"] == "SGD" and "dampening" in base
    assert "model_layout" in fingerprint_difference(base, {**base, "model_layout": "0" * 16})
    assert "no run fingerprint" in fingerprint_difference(base, None)
    two = fingerprint_difference(base, _fingerprint(lr=0.5, seed=7))
    assert two == "--seed 0 here, 7 in the checkpoint (also --lr)"


def test_force_resume_needs_a_resume_flag():
    with pytest.raises(ValueError, match="--force-resume needs --resume or --auto-resume"):
        TrainConfig(force_resume=True, checkpoint_dir="/c")
    assert (
        "--force-resume"
        in TrainConfig(force_resume=True, auto_resume=True, checkpoint_dir="/c").to_argv()
    )


def test_forced_state_trains_under_this_runs_settings():
    theirs = nn.Linear(3, 2)
    opt = torch.optim.SGD(theirs.parameters(), lr=0.05, momentum=0.9)
    theirs(torch.randn(4, 3)).sum().backward()
    opt.step()
    ours = nn.Linear(3, 2)
    mine = torch.optim.SGD(ours.parameters(), lr=0.5, momentum=0.8)
    _load(ours, mine, theirs.state_dict(), opt.state_dict(), force=True)
    assert torch.equal(ours.weight, theirs.weight)
    assert torch.equal(
        mine.state[ours.weight]["momentum_buffer"], opt.state[theirs.weight]["momentum_buffer"]
    )
    assert (mine.param_groups[0]["lr"], mine.param_groups[0]["momentum"]) == (0.5, 0.8)
    # unforced (fingerprints equal) the checkpoint's groups stand, as load_state_dict leaves them
    _load(ours, mine, theirs.state_dict(), opt.state_dict(), force=False)
    assert mine.param_groups[0]["lr"] == 0.05


def _ddp(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return run_ddp("--world-size", "1", *args, timeout=timeout_s)


@pytest.mark.timeout(300)
def test_another_configurations_checkpoint_is_refused_in_one_line_unless_forced(tmp_path):
    ckpts = str(tmp_path / "ckpt")
    first = _ddp("--steps", "2", "--checkpoint-every", "2", "--checkpoint-dir", ckpts)
    assert first.returncode == 0, first.stderr
    other = ["--steps", "3", "--lr", "0.5", "--auto-resume", "--checkpoint-dir", ckpts]
    refused = _ddp(*other)
    lines = (refused.stdout + refused.stderr).splitlines()
    assert refused.returncode == 2, lines
    assert lines == [
        f"error: checkpoint {ckpts}/ckpt_00000002.pt is another run's: --lr 0.5 here, 0.05 in "
        "the checkpoint; pass --force-resume to resume it anyway, or another --checkpoint-dir "
        "to leave it alone"
    ]
    forced = _ddp(*other, "--force-resume")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert "--force-resume: resuming" in forced.stderr and "--lr 0.5 here" in forced.stderr
    assert f"resumed from rank 0's {ckpts}/ckpt_00000002.pt (step 2)" in forced.stdout
    assert "parity holds: 1 replicas identical after all 1 steps" in forced.stdout


class Unlisted:
    """Not on torch's weights_only allowlist: a payload holding one does not load."""


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    return child.pid


@pytest.mark.timeout(300)
def test_an_unloadable_newest_is_skipped_and_a_dead_writers_temp_file_removed(tmp_path):
    logs = tmp_path / "logs"
    args = ["--steps", "4", "--checkpoint-every", "2", "--log-dir", str(logs)]
    args += ["--collective-timeout", "30"]
    first = finish(train_ranks(tmp_path, 2, *args), 120)
    assert "parity holds" in first[0], first
    directory = logs / "checkpoints"
    # the newest: well framed, hash intact, this run's fingerprint, but refused by the load
    good = read_checkpoint(checkpoint_path(directory, 2))
    save_checkpoint(directory, 4, {"x": Unlisted()}, keep=3, fingerprint=good.fingerprint)
    stale = directory / f".ckpt_00000006.pt.{_host()}.{_dead_pid()}.abc.tmp"
    stale.write_bytes(b"DDPCKPT2 half")

    again = finish(train_ranks(tmp_path, 2, *args, "--resume"), 120)
    assert (
        f"skipping unloadable checkpoint {directory}/ckpt_00000004.pt: payload does not load"
        in (again[0])
    ), again
    assert f"resumed from rank 0's {directory}/ckpt_00000002.pt (step 2)" in again[0], again
    assert "parity holds: 2 replicas identical after all 2 steps" in again[0], again
    assert any(f"removed stale checkpoint temp file {stale}" in out for out in again), again
    assert not stale.exists()
    for r in range(2):  # the state of step 2, then steps 3 and 4: where the first run ended
        assert _end_hash(logs / f"rank{r}.attempt1.jsonl") == _end_hash(logs / f"rank{r}.jsonl")


@pytest.mark.timeout(400)
def test_a_stale_volume_does_not_decide(tmp_path):
    """Rank 1's volume holds another configuration's step 6 and, older, this configuration's
    step 5 from a one-rank run (another trajectory); rank 0's holds this run's step 4, written
    last. The run resumes from rank 0's step 4 and ends where an uninterrupted run does."""
    common = ["--collective-timeout", "30", "--batch-size", "32"]
    a, b = tmp_path / "volume0", tmp_path / "volume1"
    other = ["--steps", "6", "--lr", "0.5", "--checkpoint-every", "6", "--checkpoint-dir", str(b)]
    foreign = finish(train_ranks(tmp_path, 1, *common, *other), 120)
    assert "parity holds" in foreign[0], foreign
    older = ["--steps", "5", "--checkpoint-every", "5", "--checkpoint-dir", str(b)]
    one_rank = finish(train_ranks(tmp_path, 1, *common, *older), 120)
    assert "parity holds" in one_rank[0], one_rank
    plain = tmp_path / "plain"
    two = ["--steps", "6", "--checkpoint-every", "2", "--checkpoint-dir", str(a)]
    two += ["--log-dir", str(plain)]
    assert "parity holds" in finish(train_ranks(tmp_path, 2, *common, *two), 120)[0]
    checkpoint_path(a, 6).unlink()  # rank 0's host lost its newest: step 4 is left

    volumes = [
        ["--checkpoint-dir", str(volume), "--log-dir", str(tmp_path / f"again{r}")]
        for r, volume in enumerate((a, b))
    ]
    procs = train_ranks(tmp_path, 2, *common, "--steps", "6", "--resume", per_rank=volumes)
    again = finish(procs, 120)
    assert (
        f"skipping checkpoint {b}/ckpt_00000006.pt: another run's, --lr 0.05 here, 0.5 in the "
        "checkpoint (rank 1)"
    ) in again[0], again
    assert (
        "rank 1 holds step 5, written before rank 0's step 4: resuming the most recently written"
    ) in again[0], again
    assert f"resumed from rank 0's {a}/ckpt_00000004.pt (step 4)" in again[0], again
    assert "parity holds: 2 replicas identical after all 2 steps" in again[0], again
    plain_sha = _end_hash(plain / "rank0.jsonl")
    for r in range(2):
        assert _end_hash(tmp_path / f"again{r}" / f"rank{r}.jsonl") == plain_sha


_WRITER = """
import os, sys, time
from ddp.program import checkpoint
def stall(src, dst):  # the writer stops between its temp file and the rename
    print("written", flush=True)
    time.sleep(120)
os.replace = stall
checkpoint.save_checkpoint(sys.argv[1], 6, {"w": list(range(1000))})
"""


@pytest.mark.timeout(120)
def test_a_killed_writers_temp_file_goes_a_live_writers_stays(tmp_path):
    writer = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_WRITER), str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout.readline().strip() == "written"
        (tmp,) = list(tmp_path.glob(".ckpt_00000006.pt.*.tmp"))
        assert f".{writer.pid}." in tmp.name
        assert remove_stale_temp_files(tmp_path) == [] and tmp.exists()  # its writer lives
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
    assert remove_stale_temp_files(tmp_path) == [tmp] and not tmp.exists()


def test_temp_files_whose_writer_cannot_be_checked_go_by_age(tmp_path):
    other = tmp_path / ".ckpt_00000004.pt.otherhost.12345.x1y2.tmp"
    old_name = tmp_path / ".ckpt_00000002.pt.k3j4h5.tmp"  # the first format's name
    unrelated = tmp_path / ".notes.tmp"
    for p in (other, old_name, unrelated):
        p.write_bytes(b"")
    now = time.time()
    assert remove_stale_temp_files(tmp_path, now=now) == []
    later = now + TEMP_MAX_AGE_S + 1
    assert sorted(remove_stale_temp_files(tmp_path, now=later)) == sorted([other, old_name])
    assert unrelated.exists()
