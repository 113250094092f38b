"""``python -m ddp --shard-optimizer``: parity with the single process using the same optimizer,
torch's ZeroRedundancyOptimizer with ``--wrapper torch``, checkpoints that resume bitwise (and
load into an unsharded run), and the combinations it refuses in one line with exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ddp.program.records import load_run
from tests.helpers import ROOT, run_ddp


def _one_line_error(stderr: str) -> str:
    lines = [x for x in stderr.splitlines() if x.startswith("python -m ddp")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    ("wrapper", "says"),
    [
        ("ours", "Adam sharded over 2 ranks (ZeRO-1: reduce-scatter, step, all-gather)"),
        ("torch", "Adam sharded over 2 ranks by torch's ZeroRedundancyOptimizer"),
    ],
)
def test_sharded_adam_holds_parity(wrapper, says):
    r = run_ddp(
        "--world-size", "2", "--steps", "3", "--optimizer", "adam", "--shard-optimizer",
        "--wrapper", wrapper, timeout=180,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert says in r.stdout.splitlines()[0]
    assert (
        r.stdout.strip()
        .splitlines()[-1]
        .startswith("parity holds: 2 replicas identical after all 3 steps")
    )


def _end_sha(log_dir) -> set[str]:
    return {log.end.params_sha256 for log in load_run(log_dir).values()}


@pytest.mark.timeout(400)
def test_a_sharded_checkpoint_resumes_bitwise_and_loads_unsharded(tmp_path):
    common = ["--world-size", "2", "--optimizer", "adam", "--bucket-cap-mb", "0.01"]
    sharded = [*common, "--shard-optimizer"]
    r = run_ddp(*sharded, "--steps", "5", "--log-dir", str(tmp_path / "straight"), timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    straight = _end_sha(tmp_path / "straight")
    assert len(straight) == 1  # replicas identical

    part = ["--log-dir", str(tmp_path / "part"), "--checkpoint-dir", str(tmp_path / "ckpt")]
    r = run_ddp(*sharded, "--steps", "3", "--checkpoint-every", "3", *part, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    r = run_ddp(*sharded, "--steps", "5", "--resume", *part, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "resumed from" in r.stderr + r.stdout
    assert _end_sha(tmp_path / "part") == straight

    # the checkpoint is a plain Adam's: an unsharded run takes it as its own
    plain = ["--log-dir", str(tmp_path / "plain"), "--checkpoint-dir", str(tmp_path / "ckpt")]
    r = run_ddp(*common, "--steps", "5", "--resume", *plain, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--comm-hook", "fp16"], "--shard-optimizer replaces each bucket's allreduce by a"),
        (["--model", "branchy"], "--shard-optimizer steps every parameter of its shard"),
        (["--bucket-cap-mb", "auto"], "--shard-optimizer fixes the buckets before the first"),
        (["--sync", "barrier"], "--shard-optimizer shards what the gradient sync averages"),
        (["--optimizer", "lamb"], "argument --optimizer: invalid choice: 'lamb'"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, message):
    r = run_ddp("--shard-optimizer", *args, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in _one_line_error(r.stderr)


@pytest.mark.timeout(200)
def test_the_example_loop_holds_half_the_state_at_2_ranks():
    r = subprocess.run(
        [sys.executable, "examples/sharded_optimizer.py", "--world-size", "2", "--steps", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [x for x in r.stdout.splitlines() if x.startswith("rank ")]
    assert len(lines) == 2 and all("(0.5000x)" in x for x in lines), r.stdout
    assert len({x.split("parameters ")[1] for x in lines}) == 1  # replicas identical
