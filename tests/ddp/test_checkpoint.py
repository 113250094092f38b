"""Checkpoints: bitwise-identical resume, and damaged files refused rather than loaded."""

import hashlib
import io
import random
import struct
import time

import pytest
import torch
from torch import nn

from ddp.program.checkpoint import (
    CorruptCheckpointError,
    checkpoint_path,
    checkpoint_runs,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    read_checkpoint,
    restore_rng_state,
    rng_state,
    save_checkpoint,
)

RUN = "job-1"


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Dropout(0.2), nn.Linear(16, 1))


def _optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def _train(model, opt, steps: range) -> None:
    # Data and dropout masks both come from the RNGs, so a resume that got any RNG state,
    # the momentum buffers or the step wrong drifts away from the uninterrupted run.
    model.train()
    for _ in steps:
        x = torch.randn(32, 8)
        y = x.sum(dim=1, keepdim=True) * random.uniform(0.9, 1.1)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def _state(model, opt, step: int) -> dict:
    return {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "rng": rng_state(),
        "step": step,
    }


def _resume(path, restore_rng: bool = True):
    state = load_checkpoint(path)
    torch.manual_seed(12345)  # a different init and RNG position than the original run
    random.seed(12345)
    model = _model()
    opt = _optimizer(model)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    if restore_rng:
        restore_rng_state(state["rng"])
    return model, opt, state["step"]


@pytest.fixture
def run(tmp_path):
    """Train 4 steps, checkpoint, continue to 10: returns (directory, final parameters)."""
    torch.manual_seed(0)
    random.seed(0)
    model = _model()
    opt = _optimizer(model)
    _train(model, opt, range(4))
    save_checkpoint(tmp_path, 4, _state(model, opt, 4), run=RUN)
    _train(model, opt, range(4, 10))
    return tmp_path, [p.detach().clone() for p in model.parameters()]


def test_resume_is_bitwise_identical(run):
    directory, reference = run
    found = latest_checkpoint(directory, RUN)
    assert found == (4, checkpoint_path(directory, 4, RUN))
    model, opt, step = _resume(found[1])
    assert step == 4
    _train(model, opt, range(step, 10))
    for p, ref in zip(model.parameters(), reference, strict=True):
        assert torch.equal(p, ref)


def test_resume_without_rng_state_differs(run):
    # The comparison above can fail: leaving out one piece of state shows up in the parameters.
    directory, reference = run
    model, opt, step = _resume(checkpoint_path(directory, 4, RUN), restore_rng=False)
    _train(model, opt, range(step, 10))
    assert not all(torch.equal(p, r) for p, r in zip(model.parameters(), reference, strict=True))


def test_truncated_checkpoint_is_refused(run):
    directory, _ = run
    path = checkpoint_path(directory, 4, RUN)
    data = path.read_bytes()
    for cut in (1, 8, len(data) // 2, len(data) - 10):
        path.write_bytes(data[:cut])
        with pytest.raises(CorruptCheckpointError, match=str(path)) as e:
            load_checkpoint(path)
        assert "truncated" in str(e.value) or "half-written" in str(e.value)
    path.write_bytes(data + b"extra")
    with pytest.raises(CorruptCheckpointError, match="trailing garbage"):
        load_checkpoint(path)


def test_flipped_byte_is_refused(run):
    directory, _ = run
    path = checkpoint_path(directory, 4, RUN)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match="sha256 mismatch"):
        load_checkpoint(path)
    assert issubclass(CorruptCheckpointError, ValueError)


def test_not_a_checkpoint_is_refused(tmp_path):
    path = checkpoint_path(tmp_path, 1, RUN)
    torch.save({"step": 1, "state": {}}, path)  # a plain torch file has no header
    with pytest.raises(CorruptCheckpointError, match="bad magic"):
        load_checkpoint(path)


def test_renamed_checkpoint_is_refused(tmp_path):
    path = save_checkpoint(tmp_path, 3, {"step": 3}, run=RUN)
    renamed = checkpoint_path(tmp_path, 7, RUN)
    path.rename(renamed)
    with pytest.raises(CorruptCheckpointError, match="file name says step 7"):
        load_checkpoint(renamed)


def test_latest_skips_corrupt_newest_and_temp_files(tmp_path, caplog):
    for step in (2, 4, 6):
        save_checkpoint(
            tmp_path, step, {"step": step, "w": torch.full((3,), float(step))}, keep=3, run=RUN
        )
    newest = checkpoint_path(tmp_path, 6, RUN)
    newest.write_bytes(newest.read_bytes()[:-100])  # a write cut short by a crash
    # A temp file left by a writer killed before os.replace: never considered.
    (tmp_path / ".ckpt_00000008.pt.abc123.tmp").write_bytes(b"DDPCKPT1 partial")
    with caplog.at_level("WARNING"):
        found = latest_checkpoint(tmp_path, RUN)
    assert found == (4, checkpoint_path(tmp_path, 4, RUN))
    assert f"ckpt_{RUN}_00000006.pt" in caplog.text
    assert torch.equal(load_checkpoint(found[1])["w"], torch.full((3,), 4.0))


def test_latest_of_empty_or_missing_directory(tmp_path):
    assert latest_checkpoint(tmp_path, RUN) is None
    assert latest_checkpoint(tmp_path / "nope", RUN) is None
    checkpoint_path(tmp_path, 1, RUN).write_bytes(b"")
    assert latest_checkpoint(tmp_path, RUN) is None


def test_keeps_last_k_and_leaves_no_temp_files(tmp_path):
    for step in range(0, 50, 10):
        save_checkpoint(tmp_path, step, {"step": step}, run=RUN)
    assert [s for s, _ in list_checkpoints(tmp_path, RUN)] == [30, 40]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"ckpt_{RUN}_00000030.pt",
        f"ckpt_{RUN}_00000040.pt",
    ]
    save_checkpoint(tmp_path, 50, {"step": 50}, keep=1, run=RUN)
    assert [s for s, _ in list_checkpoints(tmp_path, RUN)] == [50]


def test_pruning_touches_only_this_runs_files(tmp_path):
    """Two jobs in one directory: each keeps its newest two, whatever the other writes, and
    neither overwrites the other's file of the same step."""
    unnamed = tmp_path / "ckpt_00000009.pt"  # written before run ids: nobody's to prune
    unnamed.write_bytes(b"left alone")
    save_checkpoint(tmp_path, 2, {"by": "other"}, run="other")
    save_checkpoint(tmp_path, 4, {"by": "other"}, run="other")
    for step in (2, 4, 6, 8):
        save_checkpoint(tmp_path, step, {"by": RUN}, run=RUN)
    assert [s for s, _ in list_checkpoints(tmp_path, RUN)] == [6, 8]
    assert [s for s, _ in list_checkpoints(tmp_path, "other")] == [2, 4]
    for step in (2, 4):
        assert load_checkpoint(checkpoint_path(tmp_path, step, "other")) == {"by": "other"}
    assert unnamed.read_bytes() == b"left alone"
    assert checkpoint_runs(tmp_path) == {RUN: 8, "other": 4, None: 9}
    # and the other job's pruning leaves this one's files as they were
    save_checkpoint(tmp_path, 6, {"by": "other"}, run="other", keep=1)
    assert [s for s, _ in list_checkpoints(tmp_path, "other")] == [6]
    assert [s for s, _ in list_checkpoints(tmp_path, RUN)] == [6, 8]
    assert load_checkpoint(checkpoint_path(tmp_path, 6, RUN)) == {"by": RUN}


def test_a_run_id_that_holds_the_step_separator_is_its_own_run(tmp_path):
    # "_" and 8 digits inside an id must not make its files another run's (or another step)
    tricky = "a_00000004"
    save_checkpoint(tmp_path, 6, {}, run=tricky)
    save_checkpoint(tmp_path, 4, {}, run="a")
    assert list_checkpoints(tmp_path, tricky) == [(6, checkpoint_path(tmp_path, 6, tricky))]
    assert list_checkpoints(tmp_path, "a") == [(4, checkpoint_path(tmp_path, 4, "a"))]


def test_a_file_renamed_to_another_run_is_refused(tmp_path):
    path = save_checkpoint(tmp_path, 3, {"step": 3}, run="other")
    assert read_checkpoint(path).run == "other"
    renamed = checkpoint_path(tmp_path, 3, RUN)
    path.rename(renamed)
    with pytest.raises(CorruptCheckpointError, match="file name says run job-1, meta says other"):
        read_checkpoint(renamed)


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="step"):
        save_checkpoint(tmp_path, -1, {}, run=RUN)
    with pytest.raises(ValueError, match="keep"):
        save_checkpoint(tmp_path, 1, {}, keep=0, run=RUN)
    for bad in ("", "../up", "a/b", "-x", "x" * 65, None):
        with pytest.raises(ValueError, match="run id must be 1 to 64 letters"):
            save_checkpoint(tmp_path, 1, {}, run=bad)
    assert list(tmp_path.iterdir()) == []


def test_the_meta_says_whose_checkpoint_it_is(tmp_path):
    fingerprint = {"model": "mini", "lr": 0.05, "seed": 0}
    before = time.time_ns()
    path = save_checkpoint(tmp_path, 3, {"w": torch.ones(2)}, fingerprint=fingerprint, run=RUN)
    found = read_checkpoint(path)
    assert (found.step, found.path, found.fingerprint) == (3, path, fingerprint)
    assert before <= found.written_at_ns <= time.time_ns()
    assert torch.equal(found.state["w"], torch.ones(2))
    # the meta is under the hash: editing it is damage, not another owner
    data = path.read_bytes().replace(b'"lr": 0.05', b'"lr": 0.50')
    path.write_bytes(data)
    with pytest.raises(CorruptCheckpointError, match="sha256 mismatch"):
        read_checkpoint(path)


def test_a_first_format_checkpoint_loads_without_a_fingerprint(tmp_path):
    buf = io.BytesIO()
    torch.save({"step": 5, "state": {"w": torch.zeros(3)}}, buf)
    payload = buf.getvalue()
    header = struct.pack("<8sQ32s", b"DDPCKPT1", len(payload), hashlib.sha256(payload).digest())
    path = checkpoint_path(tmp_path, 5, RUN)
    path.write_bytes(header + payload + b"DDPCKEND")
    found = read_checkpoint(path)
    assert (found.step, found.fingerprint, found.written_at_ns) == (5, None, 0)
    assert torch.equal(found.state["w"], torch.zeros(3))
    assert latest_checkpoint(tmp_path, RUN) == (5, path)
