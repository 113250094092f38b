"""``lab memory`` without Docker: its plan (the three ways of running one job, bad values refused
naming the flag; the command line's refusals: test_cli_refusals.py), the limit chosen between
the measured peaks, and the analysis, files and closing line from synthetic rank logs, eth0
samples and the engine's memory figures."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from ddp.program.records import ConfigRecord, EndRecord, RecordLog, StepRecord
from lab.experiments import memory
from lab.experiments.memory import (
    CONFIGS,
    DDP,
    LIMITED,
    MIN_GAP_MIB,
    SHARDED,
    TORCH_ZERO,
    TRAIN_DEFAULTS,
    JobRun,
    MemoryPlan,
    MemoryResult,
    NodeMemory,
    choose_limits,
    describe_limits,
    write_files,
)


def test_the_plan_runs_one_job_three_ways_then_two_under_the_limit():
    plan = MemoryPlan()
    trains = {c.name: c.train(plan.train) for c in CONFIGS}
    assert {t.optimizer for t in trains.values()} == {"adam"}
    assert not trains[DDP.name].shard_optimizer
    assert trains[SHARDED.name].shard_optimizer and trains[SHARDED.name].wrapper == "ours"
    assert trains[TORCH_ZERO.name].shard_optimizer and trains[TORCH_ZERO.name].wrapper == "torch"
    # the reference's memory, bytes and time are the check's: measured without, limited with
    assert not any(t.reference for t in trains.values())
    assert DDP.limited(plan.train).reference and SHARDED.limited(plan.train).shard_optimizer
    assert plan.jobs == ["ddp-adam", "sharded", "torch-zero", *LIMITED.values()]
    assert MemoryPlan(limit=False).jobs == ["ddp-adam", "sharded", "torch-zero"]
    assert plan.train.model == "wide" and plan.layout.world_size == 4
    assert "4 nodes (one rank each), model wide, Adam (lr 0.001)" in plan.describe()


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"nodes": 1}, "--nodes must be >= 2"),
        ({"limit_mib": 0.0}, "--limit-mb must be a finite number > 0"),
        ({"limit_mib": float("nan")}, "--limit-mb must be a finite number > 0"),
        ({"limit": False, "limit_mib": 500.0}, "--limit-mb sets the limit of the runs --no-limit"),
        ({"train": TRAIN_DEFAULTS.replace(steps=1)}, "--steps must exceed the 1 warm-up"),
        ({"nodes": 3}, "--batch-size 64 is not divisible by the world size 3"),
        ({"run_timeout_s": 60.0}, "--collective-timeout 120 must be below --run-timeout 60"),
    ],
)
def test_bad_plans_name_the_flag(kw, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        MemoryPlan(**kw)


def test_quick_mode_is_short_and_flags_reach_the_plan():
    from lab.cli import build_parser

    _, subs = build_parser()
    plan = memory.plan(subs["memory"].parse_args(["--quick", "--nodes", "2", "--limit-mb", "700"]))
    assert plan.train.steps < TRAIN_DEFAULTS.steps and plan.nodes == 2
    assert plan.limit and plan.limit_mib == 700.0
    assert not memory.plan(subs["memory"].parse_args(["--no-limit"])).limit


# --- the limit ------------------------------------------------------------------------------


def test_the_limit_is_halfway_up_from_the_sharded_peak_and_node0_runs_unlimited():
    ddp = {0: 2000.0, 1: 1000.0, 2: 1011.0}
    sharded = {0: 2050.0, 1: 800.0, 2: 799.0}
    assert choose_limits(ddp, sharded) == {1: 900.0, 2: 905.0}
    assert choose_limits(ddp, sharded, 850.4) == {1: 850.0, 2: 850.0}
    assert describe_limits({1: 850.0, 2: 852.0}) == "850-852 MiB"
    assert describe_limits({1: 900.0, 2: 900.0}) == "900 MiB"


@pytest.mark.parametrize(
    ("ddp", "sharded", "message"),
    [
        ({0: 1.0, 1: 900.0}, {0: 1.0, 1: 900.0 - MIN_GAP_MIB / 2}, "too close to pick a limit"),
        ({0: 1.0, 1: 900.0}, {0: 1.0, 1: 950.0}, "too close to pick a limit"),
        ({0: 1.0, 1: None}, {0: 1.0, 1: 700.0}, "not reported by the engine"),
        ({0: 1.0, 1: 900.0}, {0: 1.0, 2: 700.0}, "the runs had different nodes"),
    ],
)
def test_a_limit_that_cannot_be_chosen_says_why(ddp, sharded, message):
    with pytest.raises(ValueError, match=message):
        choose_limits(ddp, sharded)


# --- the analysis on synthetic logs ---------------------------------------------------------

_T0 = 1_800_000_000.0
_STEP_S = 1.0


def _write_job(run_dir: Path, job: str, ranks: int, state: list[int], rss: list[float]) -> None:
    logs = run_dir / job / "logs"
    for rank in range(ranks):
        log = RecordLog(str(logs), rank)
        log.write(ConfigRecord(rank, ranks, 4, 0, {}))
        for step in range(1, 6):
            t0 = _T0 + (step - 1) * 2 * _STEP_S  # a second of step, a second between steps
            log.write(
                StepRecord(
                    rank,
                    step,
                    2.0,
                    1.0,
                    step_ms=1000.0 - 10 * rank,
                    comm_ms=10.0,
                    t0=t0,
                    peak_rss_mib=rss[rank] - (5 - step),
                    optimizer_state_bytes=state[rank],
                )
            )
        log.write(EndRecord(rank, True, "ab"))
        log.close()


def _counters(ranks: int, per_step: float, between: float) -> dict[int, str]:
    """Each node sends ``per_step`` bytes evenly inside each step and ``between`` bytes in the
    second after it (what the parity check moves), sampled every 0.1 s."""
    out = {}
    for node in range(ranks):
        lines, tx = [], 0.0
        for i in range(120):
            t = _T0 - 1 + i * 0.1
            lines.append(f"{t:.4f} {int(tx)} {int(tx)}")
            phase = (t - _T0) % 2
            if 0 <= t - _T0 < 10:
                tx += (per_step if phase < 1 else between) / 10
        out[node] = "\n".join(lines)
    return out


def _result(tmp_path: Path, *, ddp_killed: bool = True, sharded_fits: bool = True):
    plan = MemoryPlan(nodes=2, train=TRAIN_DEFAULTS.replace(steps=5), runs_dir=tmp_path)
    result = MemoryResult(plan, "20261202-140000-abcd", tmp_path / "run")
    figures = {
        DDP.name: ([202_000_000, 202_000_000], [1400.0, 900.0], 100e6),
        SHARDED.name: ([101_000_000, 101_000_000], [1450.0, 750.0], 100e6),
        TORCH_ZERO.name: ([134_000_000, 67_000_000], [1500.0, 1000.0], 150e6),
    }
    for name, (state, rss, link) in figures.items():
        _write_job(result.run_dir, name, 2, state, rss)
        memory_ = {n: NodeMemory(rss[n] + 20) for n in range(2)}
        result.jobs[name] = JobRun(
            name, {0: 0, 1: 0}, True, 30.0, _counters(2, link, 50e6), memory_
        )
    result.limits = {1: 845.0}
    killed = {1: NodeMemory(845.0, 845.0, 1 if ddp_killed else 0), 0: NodeMemory(1420.0)}
    codes = {0: 1, 1: -9} if ddp_killed else {0: 0, 1: 0}
    result.jobs[LIMITED[DDP.name]] = JobRun(
        LIMITED[DDP.name], codes, not ddp_killed, 9.0, {}, killed
    )
    fits = {1: NodeMemory(770.0, 845.0, 0 if sharded_fits else 1), 0: NodeMemory(1470.0)}
    codes = {0: 0, 1: 0} if sharded_fits else {0: 1, 1: -9}
    result.jobs[LIMITED[SHARDED.name]] = JobRun(
        LIMITED[SHARDED.name], codes, sharded_fits, 30.0, {}, fits
    )
    return result


def test_the_analysis_gives_state_link_and_step_ratios(tmp_path):
    s = memory.analyse(_result(tmp_path))
    ddp = s.jobs[DDP.name]
    assert [r.optimizer_state_mb for r in ddp.rows] == [202.0, 202.0]
    assert [r.peak_rss_mib for r in ddp.rows] == [1400.0, 900.0]  # the last step's: the peak
    assert [r.node_peak_mib for r in ddp.rows] == [1420.0, 920.0]
    # the bytes between steps (the parity check's gathering) are left out
    assert ddp.rows[0].link_mb_per_step == pytest.approx(100.0, rel=0.02)
    assert ddp.link_mb_per_step == pytest.approx(200.0, rel=0.02)
    assert ddp.job_step_ms == 1000.0 and ddp.steps_measured == 4
    x = s.ratios
    assert x.state_x == pytest.approx(0.5) and x.torch_state_x == pytest.approx(134 / 202)
    assert x.link_x == pytest.approx(1.0, rel=0.02) and x.torch_link_x == pytest.approx(
        1.5, rel=0.02
    )
    assert x.step_x == pytest.approx(1.0)
    assert s.limit is not None and s.limit.held and s.broken == ""
    line = memory.headline_line(s)
    assert line.startswith("sharded optimizer at 2 ranks: optimizer state 0.50x per rank")
    assert "link bytes 1.00x DDP (torch ZeRO: 1.50x)" in line
    assert line.endswith("; fits in 845 MiB where DDP+Adam was killed")
    lines = s.limit.lines()
    assert "memory limit 845 MiB on node1, no swap (node0" in lines[0]
    assert lines[1].startswith("DDP + Adam: killed for memory on node1 (the engine's oom event)")
    assert lines[2].startswith("sharded: finished, parity holds")


def test_a_limit_that_kills_nothing_or_both_is_broken(tmp_path):
    s = memory.analyse(_result(tmp_path / "a", ddp_killed=False))
    assert "DDP + Adam was NOT killed" in s.broken
    assert "DDP+Adam was NOT killed, the sharded run fits" in memory.headline_line(s)
    s = memory.analyse(_result(tmp_path / "b", sharded_fits=False))
    assert "the sharded run did NOT finish under the limit" in s.broken


def test_no_limit_chosen_is_broken_and_said(tmp_path):
    result = _result(tmp_path)
    for name in LIMITED.values():
        del result.jobs[name]
    result.limits, result.limit_error = {}, "node1: ... too close to pick a limit"
    s = memory.analyse(result)
    assert s.limit is None and "no memory-limit run: node1" in s.broken
    assert memory.headline_line(s).endswith("; no memory-limit run")


def test_the_files_hold_every_figure(tmp_path):
    s = memory.analyse(_result(tmp_path))
    files = write_files(s)
    assert [f.name for f in files] == ["memory.csv", "memory.txt", "memory.json"]
    with open(files[0]) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 6 and rows[0]["job"] == "ddp-adam"
    assert float(rows[0]["optimizer_state_mb"]) == 202.0
    assert files[1].read_text().splitlines()[-1] == memory.headline_line(s)
    doc = json.loads(files[2].read_text())
    assert doc["limit"]["ddp_killed"] and doc["limit"]["sharded_fits"]
    assert doc["limit"]["ddp"]["oom_nodes"] == [1] and doc["ratios"]["state_x"] == 0.5
    assert doc["settings"]["train"]["model"] == "wide"


def test_the_table_has_a_row_per_job_and_rank(tmp_path):
    s = memory.analyse(_result(tmp_path))
    table = memory.format_table(s).splitlines()
    assert table[0].split()[:2] == ["job", "rank"]
    assert len(table) == 1 + 3 * 3  # header; per job two ranks and the job's line
    assert table[1].startswith("DDP + Adam") and "202.0" in table[1]


def test_the_report_prints_the_table_publishes_the_page_and_ends_with_the_headline(
    tmp_path, capsys
):
    from lab.report.runs import scan_runs

    result = _result(tmp_path)
    result.run_dir = tmp_path / result.run_id  # where `lab runs` looks
    for job in CONFIGS:
        _write_job(result.run_dir, job.name, 2, [1, 1], [800.0, 700.0])
    assert memory.report(result) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert lines[-1].startswith("sharded optimizer at 2 ranks: optimizer state")
    assert lines[-1].endswith("where DDP+Adam was killed")
    assert any(line.startswith("DDP + Adam: killed for memory on node1") for line in lines)
    assert (result.run_dir / "report.html").exists()
    (entry,) = [e for e in scan_runs(tmp_path) if e.run_id == result.run_id]
    assert entry.experiment == "memory" and entry.summary.ok


def test_a_report_whose_limit_did_not_kill_ddp_exits_1(tmp_path, capsys):
    result = _result(tmp_path, ddp_killed=False)
    assert memory.report(result) == 1
    out = capsys.readouterr().out
    assert "DDP + Adam was NOT killed for memory under the limit" in out
