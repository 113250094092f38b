"""``lab topology``'s report without Docker: the bytes on the link cut to the measured steps
from sampled counters, the rows (the limit, network costs, ratios), a table per layout and the
last lines from synthetic rank logs (ddp's own record types, :mod:`tests.lab.latency_logs`),
the steps to recover after a link change, and every file (table, CSV, JSON, PNG, samples)."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path

import pytest

from lab.engine.layout import Layout
from lab.experiments import topology
from lab.experiments.link_change import ChangePlan, LinkChange
from lab.experiments.topology import (
    LIMIT,
    ConfigRun,
    LinkInfo,
    TopologyPlan,
    TopologyResult,
    headline_line,
)
from lab.measure.counters import at, parse_samples, window_bytes
from tests.lab.latency_logs import write_logs

PNG = b"\x89PNG\r\n\x1a\n"
# Slowest rank's step ms per configuration, and the bytes per second each node's eth0 sends.
STEP_MS = {
    "limit": 20.0,
    "torch": 100.0,
    "flat": 103.0,
    "hierarchical": 45.0,
    "hierarchical-fp16": 40.0,
    "auto": 95.0,
}
TX_PER_S = {
    "limit": 8e6,
    "torch": 8e6,
    "flat": 8e6,
    "hierarchical": 5e6,
    "hierarchical-fp16": 2.5e6,
    "auto": 8e6,
}
STEPS, WARMUP = 8, 3


def _counters(tx_per_s: float, t0: float = 990.0, t1: float = 1030.0) -> str:
    """A node's samples every 0.5 s: its counters grow linearly (rx at half the rate)."""
    n = int((t1 - t0) / 0.5) + 1
    lines = [
        f"{t0 + i * 0.5:.4f} {int(tx_per_s * i * 0.5)} {int(tx_per_s * i * 0.25)}" for i in range(n)
    ]
    return "\n".join(lines) + "\n1030.4"  # the last line cut by the stop


def _result(
    tmp_path: Path, parity: bool = True, layouts: tuple[Layout, ...] = (Layout(2, 2),), **kw
) -> TopologyResult:
    train = TopologyPlan().train.replace(steps=kw.pop("steps", STEPS))
    plan = TopologyPlan(layouts=layouts, rounds=1, warmup=WARMUP, train=train, **kw)
    result = TopologyResult(plan, "r1", tmp_path / "r1", seconds=42.0, cpus=2)
    probed = {"measured": {"p50_ms": 10.4}, "baseline": {"p50_ms": 0.05}, "bulk": {}}
    for lay in layouts:
        result.links.append(LinkInfo("nfqueue", "shaper nfqueue: asked 5 ms", "", probed, lay.name))
        for conf in plan.configurations(lay):
            job = f"{lay.name}-{conf.name}-r1"
            base = STEP_MS[conf.name] * lay.world_size / 4
            write_logs(
                result.run_dir / job / "logs",
                world=lay.world_size,
                steps=train.steps,
                step_ms=lambda rank, step, base=base: base - rank * 0.5,
            )
            ok = parity or conf.name != "hierarchical-fp16"
            counters = {n: _counters(TX_PER_S[conf.name]) for n in range(lay.nodes)}
            result.runs.append(
                ConfigRun(
                    conf.name,
                    1,
                    job,
                    {r: 0 for r in range(lay.world_size)},
                    ok,
                    9.0,
                    counters,
                    lay.name,
                )
            )
    return result


def test_counters_are_interpolated_and_cut_to_a_window():
    samples = parse_samples("10.0 100 50\n11.0 300 150\ngarbage\n12.0 500 250\n12.", "n0")
    assert [s.t for s in samples] == [10.0, 11.0, 12.0]
    assert at(samples, 10.5, "n0") == (200.0, 100.0)
    w = window_bytes({0: samples, 1: samples}, 10.25, 11.75, "job")
    assert (w.tx, w.rx) == (600.0, 300.0)
    with pytest.raises(ValueError, match=r"not at 13\.000"):
        at(samples, 13.0, "n0")
    with pytest.raises(ValueError, match="eth0's counters were not sampled"):
        parse_samples("", "job node1")


def test_rows_and_the_last_line(tmp_path):
    result = _result(tmp_path)
    tables, jobs = topology.combine_rounds(result)
    rows = tables[0].rows
    names = [c.name for c in result.plan.configurations()]
    assert [r.config for r in rows] == names and names[:2] == ["limit", "torch"]
    by = {r.config: r for r in rows}
    assert by["torch"].median_step_ms == 100.0 and by["torch"].speedup_vs_torch == 1.0
    assert by["hierarchical"].speedup_vs_torch == pytest.approx(100 / 45)
    assert by["flat"].step_time_vs_torch == pytest.approx(1.03)
    assert by["torch"].steps_measured == STEPS - WARMUP and by["torch"].parity
    # the limit: each row's network cost, and ours as a fraction of torch's
    assert by["limit"].network_ms == 0.0 and by["limit"].step_time_vs_limit == 1.0
    assert by["torch"].network_ms == 80.0 and by["torch"].network_vs_torch == 1.0
    assert by["hierarchical"].network_ms == 25.0
    assert by["hierarchical"].network_vs_torch == pytest.approx(25 / 80)
    assert by["hierarchical"].step_time_vs_limit == pytest.approx(45 / 20)
    assert by["limit"].title == "limit (torch DDP, bare link)"
    # The window: step 4's start on rank 0 to step 8's end on the last rank to finish it.
    window = jobs["2x2-torch-r1"].window
    assert window.start == 1004.0
    assert window.end == pytest.approx(
        max(1008 + r * 0.002 + (100 - r * 0.5) / 1e3 for r in range(4))
    )
    # Both nodes' eth0 sent at 8e6 B/s during it: the bytes per measured step.
    expected = 2 * 8e6 * (window.end - window.start) / (STEPS - WARMUP) / 1e6
    assert by["torch"].cross_mb_per_step == pytest.approx(expected)
    assert window.rx == pytest.approx(window.tx / 2)
    assert by["hierarchical-fp16"].cross_mb_per_step < by["hierarchical"].cross_mb_per_step
    assert math.isnan(by["torch"].max_param_diff)  # the synthetic logs carry no reference
    auto = "comm auto 0.95x, " if "auto" in by else ""
    auto_limit = ", comm auto 4.75x" if "auto" in by else ""
    assert headline_line(rows, result.plan) == (
        f"step time vs torch DDP (2 nodes x 2 ranks, 5 ms): {auto}hierarchical 0.45x, "
        "hierarchical-fp16 0.40x, flat 1.03x; vs the limit: torch DDP 5.00x"
        f"{auto_limit}, hierarchical 2.25x, hierarchical-fp16 2.00x, flat 5.15x"
    )


def test_rounds_pool_their_steps():
    conf = TopologyPlan().configurations()[3]
    jobs = [
        topology.JobFigures([10.0, 12.0, 14.0], 3, None, 2, 1e-7),
        topology.JobFigures([20.0, 22.0, 24.0], 3, None, 2, 3e-7),
    ]
    row = topology.make_row(conf, jobs, True)
    assert row.median_step_ms == 17.0 and row.round_step_ms == (12.0, 22.0)
    assert row.steps_measured == 6 and row.max_param_diff == 3e-7 and row.buckets == 2
    assert math.isnan(row.cross_mb_per_step)  # not sampled
    # without torch's row nothing is compared, and the last line says so honestly
    derived = topology.derive_rows([row])[0]
    assert math.isnan(derived.speedup_vs_torch) and math.isnan(derived.network_ms)


def test_files_and_the_printed_report(tmp_path, capsys):
    result = _result(tmp_path)
    assert topology.report(result) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("step time vs torch DDP (2 nodes x 2 ranks, 5 ms): ")
    took = next(line for line in out if line.startswith("took 42 s; wrote "))
    assert "topology.png" in took and out[-2].startswith("report: ")
    assert any(line.startswith("torch DDP (flat ring)") for line in out)
    assert any(line.startswith("limit (torch DDP, bare link)") for line in out)
    assert any("network ms" in line and "net vs torch" in line for line in out)
    assert any(
        line.startswith("note: every rank of every layout shares this host's 2") for line in out
    )
    run_dir = result.run_dir
    assert (run_dir / "topology.png").read_bytes()[:8] == PNG
    with open(run_dir / "topology.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["config"] for r in rows] == [c.name for c in result.plan.configurations()]
    assert rows[0]["max_param_diff"] == ""  # NaN: not measured
    assert rows[1]["network_ms"] == "80.0" and rows[1]["steps_to_recover"] == ""
    doc = json.loads((run_dir / "topology.json").read_text())
    assert doc["headline"] == out[-1] and doc["rows"][0]["max_param_diff"] is None
    n = len(result.plan.configurations())
    assert doc["settings"]["train"]["model"] == "deep" and len(doc["jobs"]) == n
    assert doc["settings"]["layouts"] == ["2x2"] and doc["cpus"] == 2
    assert doc["jobs"][0]["window"]["start"] == 1004.0
    assert (run_dir / "topology.txt").read_text().splitlines()[-1] == out[-1]
    assert (run_dir / "2x2-torch-r1" / "eth0-node1.txt").read_text().startswith("990.0000 0 0")


def test_several_layouts_a_table_each_and_a_line_each(tmp_path, capsys):
    result = _result(tmp_path, layouts=(Layout(2, 2), Layout(4, 2), Layout(8, 1)))
    assert topology.report(result) == 0
    out = capsys.readouterr().out.strip().splitlines()
    heads = [line for line in out if " one-way between nodes (none within" in line]
    assert [h.split(",")[0] for h in heads] == [
        "2 nodes x 2 ranks",
        "4 nodes x 2 ranks",
        "8 nodes x 1 rank",
    ]
    assert [line.split(",")[0] for line in out[-3:]] == [
        "step time vs torch DDP (2 nodes x 2 ranks",
        "step time vs torch DDP (4 nodes x 2 ranks",
        "step time vs torch DDP (8 nodes x 1 rank",
    ]
    # every layout's ratios against its own torch row and limit (here both scale alike)
    assert all("hierarchical 0.45x" in line for line in out[-3:-1])
    assert "hierarchical" not in out[-1] and "vs the limit: torch DDP 5.00x" in out[-1]
    note = next(line for line in out if line.startswith("note: "))
    assert "20 ms at 2x2, 40 ms at 4x2, 40 ms at 8x1" in note
    doc = json.loads((result.run_dir / "topology.json").read_text())
    assert doc["headlines"] == out[-3:] and {r["layout"] for r in doc["rows"]} == {
        "2x2",
        "4x2",
        "8x1",
    }


def test_a_link_change_shows_each_rows_steps_to_recover(tmp_path, capsys):
    # the synthetic steps start 1 s apart at t=1001 (step 1); the link in place at t=1010.5:
    # from step 11 on. torch at once; ours with two slow steps first (a re-plan).
    result = _result(tmp_path, steps=20, change=ChangePlan(10, 5.0, 20.0))
    for run in result.runs:
        if run.conf == LIMIT.name:
            continue
        run.change = LinkChange(10, 5.0, 20.0, seen_t=1010.1, applied_t=1010.5)
        run.change.probed = {"measured": {"p50_ms": 11.0}}
        slow = 2 if run.conf == "hierarchical" else 0
        base = STEP_MS[run.conf]

        def ms(rank, step, base=base, slow=slow):
            if step <= 10:
                return base - rank * 0.5
            return (3 if step <= 10 + slow else 2) * base - rank * 0.5

        write_logs(result.log_dir(run), world=4, steps=20, step_ms=ms)
    idle = {"measured": {"p50_ms": 10.6}, "baseline": {"p50_ms": 0.05}, "bulk": {"mbit_s": 19.2}}
    result.links.append(LinkInfo("nfqueue", "asked 5 ms", "", idle, "2x2", "after the change"))
    tables, _ = topology.combine_rounds(result)
    by = {r.config: r for r in tables[0].rows}
    assert by["torch"].steps_to_recover == (0,) and by["hierarchical"].steps_to_recover == (2,)
    assert by["torch"].before_ms == 100.0 and by["torch"].after_ms == 200.0
    assert by["limit"].recoveries == ()  # the limit's link stays bare
    assert topology.report(result) == 0
    out = capsys.readouterr().out
    assert "before ms" in out and "recover" in out
    assert "link change to 5 ms, 20 Mbit/s at step 10 (2x2): in place from step 11" in out
    assert "round trip p50 11.0/11.0" in out
    assert "verified idle after each job: round trip p50 10.6 ms, bulk 19.2 Mbit/s" in out
    assert "probe: round trip p50 10.40 ms" in out  # the table's link: the first, not the idle


def test_broken_parity_exits_1_and_says_where(tmp_path, capsys):
    assert topology.report(_result(tmp_path, parity=False)) == 1
    out = capsys.readouterr().out
    assert "parity BROKEN in: ours hierarchical-fp16" in out


def test_logs_without_samples_around_the_steps_exit_1(tmp_path, capsys):
    result = _result(tmp_path)
    result.runs[0].counters = {0: "1.0 0 0\n2.0 10 5\n", 1: "1.0 0 0\n2.0 10 5\n"}
    assert topology.report(result) == 1
    assert "not at 1004.000" in capsys.readouterr().err


def test_the_report_writes_its_page_and_summary(tmp_path, capsys):
    from lab.report.summary import read_summary

    result = _result(tmp_path)
    assert topology.report(result) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("step time vs torch DDP (2 nodes x 2 ranks, 5 ms): ")
    page = (result.run_dir / "report.html").read_text()
    assert "lab topology: run" in page and "parity holds in every job" in page
    assert "data:image/png;base64," in page  # the figure is inside the file
    summary = read_summary(result.run_dir)
    assert summary.experiment == "topology" and summary.ok is True
    assert "hierarchical " in summary.figure and "torch DDP" in summary.configs


def test_auto_cap_line_compares_with_the_fastest_fixed_cap_and_its_spread():
    def row(config: str, ms: float, rounds: tuple[float, ...], autos=()) -> topology.Row:
        return topology.Row(config, config, ms, rounds, 8, math.nan, 3, 0.0, True, auto_caps=autos)

    rows = [
        row("torch", 100.0, (99, 101)),
        row("flat", 90.0, (88, 92)),
        row("auto-cap", 84.0, (83, 85), (0.5, 0.5)),
        row("cap0.5", 80.0, (76, 84)),
    ]
    line = topology.auto_cap_line(rows)
    assert line.startswith("auto cap (2x2): chose 0.5 MB, 0.5 MB; median step 84.0 ms, 1.05x")
    assert "of 2 (ours cap0.5: 80.0 ms, its rounds 76/84 ms: spread 10%)" in line
    assert topology.auto_cap_line(rows[:3]) == ""  # no --caps: nothing to judge it against


def test_comm_auto_plans_are_read_from_rank_0s_plan_records(tmp_path):
    from ddp.program.records import PlanRecord

    result = _result(tmp_path)
    run = next(r for r in result.runs if r.conf == "auto")
    logs = result.log_dir(run)
    rank0 = (logs / "rank0.jsonl").read_text()
    plans = [
        PlanRecord(0, 2, 25.0, "flat", 79.2, None, "first plan: measured the links; more"),
        PlanRecord(0, 14, 5.0, "direct", 40.0, 120.0, "re-planned: steps 50% slower"),
    ]
    lines = rank0.splitlines()
    lines[1:1] = [json.dumps({"event": "plan", **dataclasses.asdict(p)}) for p in plans]
    (logs / "rank0.jsonl").write_text("\n".join(lines) + "\n")
    tables, _ = topology.combine_rounds(result)
    assert [p["step"] for p in tables[0].row("auto").plans] == [2, 14]
    assert topology.plans_line(tables[0]) == (
        "comm auto's plans (2x2, rank 0, last round): step 2: 25 MB flat, predicted 79.2 ms "
        "(first plan: measured the links); step 14: 5 MB direct, predicted 40.0 ms, measured "
        "120.0 ms (re-planned: steps 50% slower)"
    )
