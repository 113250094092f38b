"""``lab straggler`` without Docker: its plan (the quota from --slowdown, bad values refused
naming the flag; the command line's refusals: test_cli_refusals.py), compute vs waiting from
synthetic rank logs, and every file of the report (table, CSV, JSON, Chrome trace, Gantt chart)."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from ddp.program.records import ConfigRecord, EndRecord, RecordLog, StepRecord, load_run
from lab.experiments import straggler
from lab.experiments.straggler import TRAIN_DEFAULTS, JobRun, StragglerPlan, StragglerResult

PNG = b"\x89PNG\r\n\x1a\n"


def _plan(**kw) -> StragglerPlan:
    return StragglerPlan(**{"host_cpus": 2, **kw})


def test_the_quota_is_the_fair_share_divided_by_the_slowdown():
    p = _plan(slowdown=4.0)
    assert p.share == 0.5 and p.quota == pytest.approx(0.125)
    assert _plan(cpus=0.3).quota == 0.3  # --cpus overrides --slowdown
    assert _plan(slowdown=1.0, slow_link_ms=5.0).quota is None  # only the link is slowed
    assert "CPU quota of 0.125 cores (--slowdown 4; fair share 0.5" in p.describe()
    assert p.node == 1 and p.layout.world_size == 4


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"rank": 4}, "--rank must be in 0..3"),
        ({"slowdown": 1.0}, "nothing slows the straggler"),
        ({"cpus": 5.0}, "--cpus must be between 0.01 and the host's 2 cores"),
        ({"slow_link_ms": float("nan")}, "--slow-link-ms must be a finite number"),
        ({"train": TRAIN_DEFAULTS.replace(steps=2)}, "--steps must exceed the 2 warm-up"),
        ({"run_timeout_s": 30.0}, "--collective-timeout 60 must be below --run-timeout 30"),
        ({"nodes": 3}, "--batch-size 1024 is not divisible by the world size 3"),
    ],
)
def test_bad_plans_name_the_flag(kw, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        _plan(**kw)


def test_help_explains_the_barrier():
    assert "the gradient allreduce is a barrier" in " ".join(straggler.DESCRIPTION.split())
    assert "fair share" in straggler.EPILOG and "gantt.png" in straggler.EPILOG


def test_quick_mode_is_short():
    from lab.cli import build_parser

    _, subs = build_parser()
    args = subs["straggler"].parse_args(["--quick"])
    assert straggler.plan(args).train.steps == 8


def _write(log_dir: Path, compute, steps: int = 6, world: int = 4) -> Path:
    """A job in which rank r computes ``compute(r)`` ms per step and everyone's step lasts as
    long as the slowest rank's: the others wait the difference (comm_ms), as in allreduce."""
    slowest = max(compute(r) for r in range(world))
    for rank in range(world):
        log = RecordLog(str(log_dir), rank)
        log.write(ConfigRecord(rank, world, 1, 0, {}))
        for step in range(1, steps + 1):
            c = compute(rank)
            wait = slowest - c + 1.0  # + 1 ms of transfer
            timeline = {"backward_ms": [c * 0.3, c], "buckets_ms": [[c * 0.5, slowest + 0.5]]}
            log.write(StepRecord(rank, step, 1.0, 1.0, c + wait, wait, 1000.0 + step, **timeline))
        log.write(EndRecord(rank, True, "0" * 64))
        log.close()
    return log_dir


def test_compute_and_waiting_per_rank(tmp_path):
    base = straggler.job_stats(load_run(_write(tmp_path / "b", lambda r: 20.0)), warmup=2)
    slow = straggler.job_stats(
        load_run(_write(tmp_path / "s", lambda r: 80.0 if r == 1 else 20.0)), warmup=2
    )
    assert slow.compute_ms == {0: 20.0, 1: 80.0, 2: 20.0, 3: 20.0}
    assert slow.waiting_ms == {0: 61.0, 1: 1.0, 2: 61.0, 3: 61.0}
    assert slow.job_step_ms == 81.0 and slow.steps_measured == 4
    s = straggler.summarize(base, slow, straggler=1)
    assert s.straggler_compute_x == 4.0 and s.job_x == pytest.approx(81 / 21)
    assert s.others_waiting_ms == 61.0
    assert all(r.vs_baseline == pytest.approx(81 / 21) for r in s.rows)  # everyone is slowed
    with pytest.raises(ValueError, match="run more --steps"):
        straggler.job_stats(load_run(_write(tmp_path / "short", lambda r: 1.0, steps=2)), 2)


def test_every_file_of_the_report(tmp_path, capsys):
    plan = _plan(runs_dir=tmp_path)
    result = StragglerResult(plan, "r1", tmp_path / "r1", seconds=12.0)
    _write(result.log_dir("baseline"), lambda r: 20.0)
    _write(result.log_dir("straggler"), lambda r: 80.0 if r == 1 else 20.0)
    result.jobs = {
        n: JobRun(n, {r: 0 for r in range(4)}, True, 5.0) for n in ("baseline", "straggler")
    }
    assert straggler.report(result) == 0
    out = capsys.readouterr().out
    assert re.search(r"^1 \(slow\)\s+80\.0\s+1\.0\s+81\.0\s+21\.0\s+3\.86x", out, re.M), out
    assert re.search(r"^0\s+20\.0\s+61\.0\s+81\.0\s+21\.0\s+3\.86x", out, re.M), out
    assert out.strip().splitlines()[-1] == (
        "straggler rank 1: its compute 4.0x slower, every rank's step 3.9x (21.0 -> 81.0 ms); "
        "the others wait 61.0 ms per step in allreduce"
    )
    run_dir = result.run_dir
    with open(run_dir / "straggler.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["straggler"] for r in rows] == ["False", "True", "False", "False"]
    doc = json.loads((run_dir / "straggler.json").read_text())
    assert doc["settings"]["quota_cpus"] == 0.125 and doc["straggler_compute_x"] == 4.0
    trace = json.loads((run_dir / "trace.json").read_text())
    assert {"forward", "backward", "allreduce bucket 0"} <= {
        e["name"] for e in trace["traceEvents"]
    }
    assert (run_dir / "gantt.png").read_bytes()[:8] == PNG
    summary = straggler.analyse(result).figures
    assert straggler.format_table(summary).count("\n") == 5
    assert straggler.headline_line(summary, 1, cpu=False).startswith(
        "straggler rank 1: its link slower, every rank's step 3.9x"
    )
