"""The example scripts under torchrun at 2 gloo ranks, instrumented as the lab runs them
(``DDP_INSTRUMENT=1``, the site directory on ``PYTHONPATH``): each trains, and every rank
leaves its step records, its flight recorder's exit dump and a digest at exit that agrees with
the one the script prints itself."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ddp.flight.dumps import load_dumps
from ddp.instrument.env import instrument_environment
from ddp.instrument.records import ScriptDDPRecord, ScriptHookRecord
from ddp.program.records import load_run, parse_record_line
from tests.helpers import ROOT

# example, its arguments, steps it takes, the wrapper, the comm hook it registers
EXAMPLES = {
    "mlp": (["--steps", "6", "--log-every", "3"], 6, "torch", None),
    # 1437 training digits, 719 per rank (the sampler pads), batches of 32 without the last
    "digits": (["--epochs", "1"], 22, "torch", None),
    "our_wrapper": (["--steps", "4", "--log-every", "2"], 4, "ddp", "fp16_compress_hook"),
}


def _torchrun(script: str, args: list[str], log_dir: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        **instrument_environment(str(log_dir), pythonpath=os.environ.get("PYTHONPATH") or None),
        "OMP_NUM_THREADS": "1",
    }
    env["PYTHONPATH"] += os.pathsep + str(ROOT)  # the examples import ddp (our_wrapper)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    return subprocess.run(
        [*cmd, str(ROOT / "examples" / f"{script}.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_example_runs_instrumented_at_two_ranks(name: str, tmp_path: Path) -> None:
    if name == "digits":
        pytest.importorskip("sklearn", reason="examples/digits.py needs scikit-learn")
    args, steps, wrapper, hook = EXAMPLES[name]
    out = _torchrun(name, args, tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    printed = dict(re.findall(r"rank (\d): parameters sha256 ([0-9a-f]{16})", out.stdout))
    assert sorted(printed) == ["0", "1"], out.stdout
    live = [parse_record_line(line) for line in out.stdout.splitlines()]
    assert sum(r is not None for r in live) >= 2 * (steps + 2), "records also on stdout"

    logs = load_run(tmp_path)
    assert sorted(logs) == [0, 1]
    for rank, log in logs.items():
        built = [r for r in log.records if isinstance(r, ScriptDDPRecord)]
        assert [(b.wrapper, b.world_size) for b in built] == [(wrapper, 2)]
        assert [s.step for s in log.script_steps] == list(range(1, steps + 1))
        assert all(s.allreduces >= 1 and s.bytes > 0 for s in log.script_steps)
        hooks = [r.hook for r in log.records if isinstance(r, ScriptHookRecord)]
        assert hooks == ([hook] if hook else [])
        (end,) = log.script_end
        assert end.steps == steps
        assert end.params_sha256.startswith(printed[str(rank)]), "the script's own digest"
    assert logs[0].script_end[0].params_sha256 == logs[1].script_end[0].params_sha256
    assert {d["reason"] for d in load_dumps(tmp_path).values()} == {"exit"}


@pytest.mark.timeout(300)
def test_our_own_program_is_left_to_its_own_records(tmp_path: Path) -> None:
    """``python -m ddp`` writes its own rank logs: instrumenting it too would put a second
    log beside each (``rank<R>.attempt1.jsonl``), which readers take for a restart."""
    env = {
        **os.environ,
        **instrument_environment(str(tmp_path / "instrument"), pythonpath=str(ROOT)),
        "OMP_NUM_THREADS": "1",
    }
    logs = tmp_path / "logs"
    out = subprocess.run(
        [sys.executable, "-m", "ddp", "--world-size", "2", "--steps", "2", "--log-dir", str(logs)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert sorted(p.name for p in logs.glob("rank*.jsonl")) == ["rank0.jsonl", "rank1.jsonl"]
    assert not any(log.script_steps or log.script_end for log in load_run(logs).values())
    assert not (tmp_path / "instrument").exists()


@pytest.mark.timeout(300)
def test_a_killed_rank_is_named_from_the_survivors_dumps(tmp_path: Path) -> None:
    """SIGKILL one of 3 ranks mid-run: the survivors' collective fails, they exit through
    their exit handlers, and their flight recorder dumps name the rank that never arrived."""
    import signal
    import time

    from ddp.flight.diagnosis import diagnose
    from ddp.program.records import read_rank_log

    env = {
        **os.environ,
        **instrument_environment(str(tmp_path), pythonpath=str(ROOT)),
        "OMP_NUM_THREADS": "1",
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3"]
    script = [str(ROOT / "examples" / "mlp.py"), "--steps", "1000000", "--log-every", "1000000"]
    proc = subprocess.Popen(
        [*cmd, *script],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        log2 = tmp_path / "rank2.jsonl"
        deadline = time.monotonic() + 200
        while not (log2.exists() and len(read_rank_log(log2).script_steps) >= 3):
            assert proc.poll() is None, "torchrun ended before rank 2 took 3 steps"
            assert time.monotonic() < deadline, "rank 2 took no 3 steps in 200 s"
            time.sleep(0.1)
        (built,) = [r for r in read_rank_log(log2).records if isinstance(r, ScriptDDPRecord)]
        os.kill(built.pid, signal.SIGKILL)
        assert proc.wait(timeout=200) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    dumps = load_dumps(tmp_path)
    assert sorted(dumps) == [0, 1]
    diagnosis = diagnose(dumps, 3)
    # rank 2 never arrived; a survivor that torchrun's agent stopped (SIGTERM, after rank 2's
    # death) before it reached the same collective is named missing too, as its recorder says
    # (seen once in CI under load: "ranks 1,2 missing"); at least one survivor arrived, waited
    # and noticed
    missing, noticed = diagnosis.missing_ranks, diagnosis.noticed
    assert 2 in missing and noticed and 2 not in noticed, diagnosis.summary()
    assert diagnosis.op == "allreduce", diagnosis.summary()
    assert re.match(r"ranks? (\d,)*2 missing at step ", diagnosis.summary()), diagnosis.summary()
