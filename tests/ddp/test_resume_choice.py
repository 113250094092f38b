"""Resume picks this run's state or none: another job's checkpoints in the same directory are
neither resumed nor pruned, another configuration's checkpoint is refused in one line (exit 2)
unless forced, an unloadable newest checkpoint is skipped for the one before, ranks agree on
the highest step whatever the writers' clocks said, and a killed writer's temp file goes while
a live writer's stays."""

from __future__ import annotations

import hashlib
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from ddp.program.checkpoint import (
    TEMP_MAX_AGE_S,
    _host,
    checkpoint_path,
    list_checkpoints,
    read_checkpoint,
    remove_stale_temp_files,
    save_checkpoint,
)
from ddp.program.config import DEFAULT_RUN_ID, TrainConfig
from ddp.program.models import build_model
from ddp.program.optimizer import build_optimizer
from ddp.program.resume import _load, fingerprint_difference, resume_owner, run_fingerprint
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
        "run_id": "another-job",
    }
    for name, value in differ.items():
        theirs = _fingerprint(**{name: value})
        text = fingerprint_difference(base, theirs)
        flag = "--" + name.replace("_", "-")
        assert text.startswith(f"{flag} {base[name]} here, {value} in the checkpoint"), text
    assert base["run_id"] == DEFAULT_RUN_ID
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
        f"error: checkpoint {ckpts}/ckpt_default_00000002.pt is another configuration's: --lr "
        "0.5 here, 0.05 in the checkpoint; pass --force-resume to resume it anyway, or another "
        "--run-id or --checkpoint-dir to leave it alone"
    ]
    forced = _ddp(*other, "--force-resume")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert "--force-resume: resuming" in forced.stderr and "--lr 0.5 here" in forced.stderr
    assert f"resumed from rank 0's {ckpts}/ckpt_default_00000002.pt (step 2)" in forced.stdout
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
    good = read_checkpoint(checkpoint_path(directory, 2, DEFAULT_RUN_ID))
    save_checkpoint(
        directory, 4, {"x": Unlisted()}, run=good.run, keep=3, fingerprint=good.fingerprint
    )
    stale = directory / f".ckpt_default_00000006.pt.{_host()}.{_dead_pid()}.abc.tmp"
    stale.write_bytes(b"DDPCKPT2 half")

    again = finish(train_ranks(tmp_path, 2, *args, "--resume"), 120)
    assert (
        f"skipping unloadable checkpoint {directory}/ckpt_default_00000004.pt: payload does "
        "not load" in (again[0])
    ), again
    assert f"resumed from rank 0's {directory}/ckpt_default_00000002.pt (step 2)" in again[0]
    assert "parity holds: 2 replicas identical after all 2 steps" in again[0], again
    assert any(f"removed stale checkpoint temp file {stale}" in out for out in again), again
    assert not stale.exists()
    for r in range(2):  # the state of step 2, then steps 3 and 4: where the first run ended
        assert _end_hash(logs / f"rank{r}.attempt1.jsonl") == _end_hash(logs / f"rank{r}.jsonl")


def _digests(directory: Path, run: str) -> dict[str, str]:
    """File name -> sha256 of the bytes, of run ``run``'s checkpoints."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for _, p in list_checkpoints(directory, run)
    }


@pytest.mark.timeout(400)
def test_two_jobs_in_one_directory_neither_resume_nor_prune_the_others(tmp_path):
    """Job a, then job b with the same configuration in the same directory: b starts fresh
    (a's step 4 is not its), and neither job's pruning touches the other's files; a restart of a
    (the same --run-id) resumes a's newest, not b's higher step."""
    ckpts = tmp_path / "ckpt"
    common = ["--checkpoint-every", "2", "--checkpoint-dir", str(ckpts), "--no-reference"]
    first = _ddp("--run-id", "a", "--steps", "4", *common)
    assert first.returncode == 0, first.stdout + first.stderr
    a_files = _digests(ckpts, "a")
    assert sorted(a_files) == ["ckpt_a_00000002.pt", "ckpt_a_00000004.pt"]

    other = _ddp("--run-id", "b", "--steps", "6", "--auto-resume", *common)
    assert other.returncode == 0, other.stdout + other.stderr
    assert (
        f"--auto-resume: no complete checkpoint in {ckpts} for run b (it holds run a's up to "
        "step 4: pass --run-id ID to resume one), starting fresh"
    ) in other.stderr, other.stderr
    assert _digests(ckpts, "a") == a_files  # b wrote 2, 4, 6 and pruned only its own
    b_files = _digests(ckpts, "b")
    assert sorted(b_files) == ["ckpt_b_00000004.pt", "ckpt_b_00000006.pt"]

    again = _ddp("--run-id", "a", "--steps", "6", "--auto-resume", *common)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"resumed from rank 0's {ckpts}/ckpt_a_00000004.pt (step 4)" in again.stdout, again
    assert "parity holds: 1 replicas identical after all 2 steps" in again.stdout, again
    assert sorted(_digests(ckpts, "a")) == ["ckpt_a_00000004.pt", "ckpt_a_00000006.pt"]
    assert _digests(ckpts, "b") == b_files

    nameless = _ddp("--steps", "6", "--resume", "--checkpoint-dir", str(ckpts))
    assert nameless.returncode == 2, nameless.stdout + nameless.stderr
    assert (
        f"--resume: no complete checkpoint in {ckpts} for run default (it holds run a's up to "
        "step 6, run b's up to step 6: pass --run-id ID to resume one)"
    ) in nameless.stderr, nameless.stderr


def test_the_owner_is_the_highest_step_then_the_lowest_rank():
    def seen(*steps):
        # what the ranks gathered; a write time, were one there, must not count
        return [{"step": s, "written_at_ns": -i} for i, s in enumerate(steps)]

    assert resume_owner(seen(4, 6, None)) == 1
    assert resume_owner(seen(6, 6, 4)) == 0
    assert resume_owner(seen(None, 2, 2)) == 1
    assert resume_owner(seen(None, None)) is None


_HOUR_NS = 3600 * 10**9


@pytest.mark.timeout(400)
def test_ranks_agree_by_step_not_by_the_writers_clock(tmp_path, monkeypatch):
    """Rank 0's volume holds this run's step 8. Rank 1's holds this run's step 4 written by a
    host whose clock runs an hour ahead, another configuration's step 9 under this run id, and
    an earlier job's step 12 of this configuration under another run id. The run resumes from
    rank 0's step 8 and ends where an uninterrupted run does."""
    common = ["--collective-timeout", "30", "--batch-size", "32"]
    a, b = tmp_path / "volume0", tmp_path / "volume1"
    for flags in (
        ["--run-id", "earlier", "--steps", "12", "--checkpoint-every", "12"],
        ["--lr", "0.5", "--steps", "9", "--checkpoint-every", "9"],
        ["--steps", "4", "--checkpoint-every", "4"],
    ):
        out = finish(train_ranks(tmp_path, 1, *common, *flags, "--checkpoint-dir", str(b)), 120)
        assert "parity holds" in out[0], out
    ahead = read_checkpoint(checkpoint_path(b, 4, DEFAULT_RUN_ID))
    real = time.time_ns
    with monkeypatch.context() as m:  # rewritten as that host would have written it
        m.setattr(time, "time_ns", lambda: real() + _HOUR_NS)
        save_checkpoint(b, 4, ahead.state, run=ahead.run, fingerprint=ahead.fingerprint)
    assert read_checkpoint(checkpoint_path(b, 4, DEFAULT_RUN_ID)).written_at_ns > real() + 1e12
    plain = tmp_path / "plain"
    two = ["--steps", "10", "--checkpoint-every", "4", "--checkpoint-dir", str(a)]
    assert (
        "parity holds"
        in finish(train_ranks(tmp_path, 2, *common, *two, "--log-dir", str(plain)), 120)[0]
    )
    checkpoint_path(a, 10, DEFAULT_RUN_ID).unlink()  # rank 0's host lost its newest: 8 is left

    volumes = [
        ["--checkpoint-dir", str(volume), "--log-dir", str(tmp_path / f"again{r}")]
        for r, volume in enumerate((a, b))
    ]
    procs = train_ranks(tmp_path, 2, *common, "--steps", "10", "--resume", per_rank=volumes)
    again = finish(procs, 120)
    assert (
        f"skipping checkpoint {b}/ckpt_default_00000009.pt: another configuration's, --lr 0.05 "
        "here, 0.5 in the checkpoint (rank 1)"
    ) in again[0], again
    assert f"resumed from rank 0's {a}/ckpt_default_00000008.pt (step 8)" in again[0], again
    assert "parity holds: 2 replicas identical after all 2 steps" in again[0], again
    assert "ckpt_earlier" not in again[0] + again[1], again
    plain_sha = _end_hash(plain / "rank0.jsonl")
    for r in range(2):
        assert _end_hash(tmp_path / f"again{r}" / f"rank{r}.jsonl") == plain_sha
    assert [s for s, _ in list_checkpoints(b, "earlier")] == [12]


_WRITER = """
import os, sys, time
from ddp.program import checkpoint
def stall(src, dst):  # the writer stops between its temp file and the rename
    print("written", flush=True)
    time.sleep(120)
os.replace = stall
checkpoint.save_checkpoint(sys.argv[1], 6, {"w": list(range(1000))}, run="w")
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
        (tmp,) = list(tmp_path.glob(".ckpt_w_00000006.pt.*.tmp"))
        assert f".{writer.pid}." in tmp.name
        assert remove_stale_temp_files(tmp_path) == [] and tmp.exists()  # its writer lives
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
    assert remove_stale_temp_files(tmp_path) == [tmp] and not tmp.exists()


def test_temp_files_whose_writer_cannot_be_checked_go_by_age(tmp_path):
    other = tmp_path / ".ckpt_job_2_00000004.pt.otherhost.12345.x1y2.tmp"
    unnamed = tmp_path / ".ckpt_00000004.pt.otherhost.12345.x1y2.tmp"  # before run ids
    old_name = tmp_path / ".ckpt_00000002.pt.k3j4h5.tmp"  # the first format's name
    unrelated = tmp_path / ".notes.tmp"
    for p in (other, unnamed, old_name, unrelated):
        p.write_bytes(b"")
    now = time.time()
    assert remove_stale_temp_files(tmp_path, now=now) == []
    later = now + TEMP_MAX_AGE_S + 1
    gone = sorted(remove_stale_temp_files(tmp_path, now=later))
    assert gone == sorted([other, unnamed, old_name])
    assert unrelated.exists()
