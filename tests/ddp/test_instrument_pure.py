"""ddp.instrument without ranks: the environment contract, where steps start and end, and
that the activation costs a process that never builds a DDP nothing (no torch import)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ddp.flight.recorder import FlightRecorder
from ddp.instrument.env import (
    ENV_EMIT_RECORDS,
    ENV_FLIGHT_CAPACITY,
    ENV_INSTRUMENT,
    ENV_LOG_DIR,
    InstrumentEnv,
    instrument_environment,
    site_dir,
)
from ddp.instrument.records import ScriptStepRecord
from ddp.instrument.session import Probe, Session
from ddp.instrument.tally import StepTally
from ddp.program.records import RECORD_PREFIX, RecordLog, parse_record_line, read_rank_log
from tests.helpers import ROOT


def test_env_reads_the_contract() -> None:
    env = InstrumentEnv.from_environ(
        {ENV_INSTRUMENT: "1", ENV_LOG_DIR: "/logs", ENV_EMIT_RECORDS: "1", ENV_FLIGHT_CAPACITY: "8"}
    )
    assert env == InstrumentEnv(True, "/logs", True, 8)
    assert InstrumentEnv.from_environ({}) == InstrumentEnv()
    assert not InstrumentEnv.from_environ({ENV_INSTRUMENT: "yes"}).enabled


@pytest.mark.parametrize("bad", ["0", "-3", "many"])
def test_env_refuses_a_bad_capacity(bad: str) -> None:
    with pytest.raises(ValueError, match=ENV_FLIGHT_CAPACITY):
        InstrumentEnv.from_environ({ENV_FLIGHT_CAPACITY: bad})


def test_launcher_environment_puts_the_site_first() -> None:
    env = instrument_environment("/logs", pythonpath="/work")
    assert env[ENV_INSTRUMENT] == "1" and env[ENV_LOG_DIR] == "/logs"
    assert env["PYTHONPATH"] == os.pathsep.join([str(site_dir()), "/work"])
    assert (site_dir() / "sitecustomize.py").is_file()
    assert ENV_LOG_DIR not in instrument_environment(None)


def _probe(tmp_path) -> tuple[Probe, StepTally]:
    session = Session(InstrumentEnv(True, str(tmp_path)))
    session._log = RecordLog(str(tmp_path), 0)
    tally = StepTally(FlightRecorder(0, 1))
    return Probe(session, 0, tally, []), tally


def _steps(tmp_path) -> list[ScriptStepRecord]:
    return read_rank_log(tmp_path / "rank0.jsonl").script_steps


def test_a_step_is_a_syncing_forward_and_what_precedes_it(tmp_path) -> None:
    probe, tally = _probe(tmp_path)
    labels: list[int] = []
    probe.on_step.append(labels.append)
    probe.on_forward(sync=True)  # step 1
    seq = tally.start("allreduce", step=1, bucket=0, nbytes=100)
    tally.complete(seq)
    tally.start("broadcast", step=1)  # not a bucket: not counted
    probe.on_forward(sync=False)  # step 2: no_sync micro-batches ...
    probe.on_forward(sync=False)
    probe.on_forward(sync=True)  # ... and the forward that syncs them
    for b in (0, 1):
        tally.complete(tally.start("comm_hook", step=2, bucket=b, nbytes=10))
    probe.on_forward(sync=True)  # step 3: closes step 2
    steps = _steps(tmp_path)
    assert [s.step for s in steps] == [1, 2] and labels == [1, 2, 3]
    assert (steps[0].allreduces, steps[0].bytes, steps[0].bucket_bytes) == (1, 100, [100])
    assert (steps[1].allreduces, steps[1].bytes, steps[1].bucket_bytes) == (2, 20, [10, 10])
    assert steps[0].t1 == steps[1].t0
    launch, done = steps[1].buckets_ms[1]
    assert 0 <= launch <= done <= steps[1].step_ms


def test_exit_ends_the_last_step_at_its_last_collective(tmp_path) -> None:
    probe, tally = _probe(tmp_path)
    probe.on_forward(sync=True)
    seq = tally.start("allreduce", step=1, bucket=0, nbytes=4)
    tally.complete(seq)
    tally.start("allreduce", step=1, bucket=1, nbytes=4)  # never completes (a hang)
    probe.finish()
    (step,) = _steps(tmp_path)
    assert step.allreduces == 2 and step.buckets_ms[1][1] is None
    assert step.t1 == pytest.approx(step.t0 + step.buckets_ms[0][1] / 1e3, abs=1e-5)
    end = read_rank_log(tmp_path / "rank0.jsonl").script_end
    assert len(end) == 1 and end[0].steps == 1 and len(end[0].params_sha256) == 64


def test_records_cross_stdout_as_the_project_reads_them() -> None:
    step = ScriptStepRecord(3, 0, 7, 1.0, 1.5, 500.0, 2, 40, 3.0, [[1.0, 2.0], [2.0, None]])
    assert parse_record_line(RECORD_PREFIX + step.to_json()) == step


def test_activation_imports_no_torch_until_a_ddp_is_built() -> None:
    env = {**os.environ, **instrument_environment(None, pythonpath=str(ROOT))}
    code = (
        "import sys; print('torch' in sys.modules, any('Finder' in repr(f) for f in sys.meta_path))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"], out.stdout + out.stderr


@pytest.mark.parametrize("field", ["ranks", "rounds", "steps", "width", "depth", "batch"])
def test_bench_refuses_nothing_to_measure(field: str) -> None:
    from ddp.instrument.bench import BenchConfig

    with pytest.raises(ValueError, match=f"--{field} must be >= 1"):
        BenchConfig(**{field: 0})
