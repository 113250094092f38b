"""``python -m lab latency`` without Docker: sweep planning, argument errors, and every output
(table, CSV, JSON, plot, Chrome trace, Gantt) built from synthetic logs in ddp's documented
format (config record, step records with t0/backward_ms/buckets_ms, end record)."""

from __future__ import annotations

import csv
import itertools
import json
import math
import re
from pathlib import Path

import pytest

from lab import cli, report, timeline
from lab.latency import (
    ConfigRun,
    SweepResult,
    combine_rounds,
    default_timeline_cap,
    write_outputs,
)
from lab.sweep import RunSpec, SweepSettings, plan_sweep, rank_command, run_name

PNG = b"\x89PNG\r\n\x1a\n"
HEADLINE = re.compile(
    r"^bucketing speedup at \d+(\.\d+)? ms: \d+\.\dx \(per-parameter vs best bucketed\), "
    r"overlap gain: \d+\.\dx$"
)


def write_logs(
    log_dir: Path,
    *,
    world: int = 4,
    steps: int = 6,
    buckets: int = 3,
    step_ms=lambda rank, step: 100.0 + rank + step,
    sync: str = "allreduce",
    parity: bool = True,
) -> Path:
    """Per-rank JSON lines as ``python -m ddp train --log-dir`` writes them."""
    log_dir.mkdir(parents=True, exist_ok=True)
    for rank in range(world):
        lines = [
            {"event": "config", "rank": rank, "world_size": world,
             "num_buckets": buckets if sync == "allreduce" else 0, "sync": sync}
        ]  # fmt: skip
        for step in range(1, steps + 1):
            ms = step_ms(rank, step)
            record = {"event": "step", "rank": rank, "step": step, "loss": 1.0 / step,
                      "checksum": 42.0 + step, "step_ms": ms, "comm_ms": ms / 2,
                      "t0": 1000.0 + step + rank * 0.002}  # fmt: skip
            if sync == "allreduce":
                record["backward_ms"] = [2.0, 10.0]
                # Overlapping in flight: bucket k launched at 3+2k, done at 40+20k.
                record["buckets_ms"] = [[3.0 + 2 * k, 40.0 + 20 * k] for k in range(buckets)]
            if rank == 0:
                record.update(ref_loss=1.0 / step, ref_checksum=42.0 + step, max_param_diff=0.0)
            lines.append(record)
        lines.append({"event": "end", "rank": rank, "parity": parity})
        (log_dir / f"rank{rank}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return log_dir


def row(ms, cap, overlap, median, calls=1, parity=True):
    return report.Row(ms, "x" if cap is None else f"{cap}-{overlap}", cap, overlap, calls,
                      median, median / 2, 10, None if cap is None else parity)  # fmt: skip


# --- sweep planning --------------------------------------------------------------------------


def test_plan_runs_the_floor_first_then_each_cap_with_overlap_on_and_off():
    plan = plan_sweep(SweepSettings(caps=(0, 1, 25)))
    assert [(s.cap_mb, s.overlap) for s in plan] == [
        (None, None), (0, True), (0, False), (1, True), (1, False), (25, True), (25, False)
    ]  # fmt: skip
    assert len({s.name for s in plan}) == len(plan)
    assert plan[1].label == "per-parameter, overlap on"
    assert plan[4].label == "cap 1 MB, overlap off"


def test_rank_commands_share_everything_but_cap_overlap_and_sync():
    settings = SweepSettings(caps=(0, 4), steps=7, model="deep", seed=3)
    floor, on, off = plan_sweep(settings)[:3]
    cmds = {s.name: rank_command(s, settings, 5.0, 2) for s in (floor, on, off)}
    for cmd in cmds.values():
        assert cmd[:4] == ["timeout", "-k", "10", "300"]
        assert cmd[4:8] == ["python", "-m", "ddp", "train"]
        joined = " ".join(cmd)
        for flag in ("--rank 2", "--world-size 4", "--steps 7", "--model deep", "--seed 3"):
            assert flag in joined
    assert cmds["nosync"][-2:] == ["--sync", "none"]
    assert "--no-overlap" in cmds["cap0-nooverlap"]
    assert "--no-overlap" not in cmds["cap0-overlap"]
    assert "--bucket-cap-mb 0" in " ".join(cmds["cap0-overlap"])

    def value(cmd, flag):
        return cmd[cmd.index(flag) + 1]

    # A fresh rendezvous file per configuration and per delay: a stale one breaks gloo.
    rendezvous = {value(c, "--init-method") for c in cmds.values()}
    rendezvous.add(value(rank_command(on, settings, 1.0, 2), "--init-method"))
    assert len(rendezvous) == 4
    assert value(cmds["cap0-overlap"], "--log-dir").endswith("/5ms-cap0-overlap-r1")
    # ... and per round.
    assert value(rank_command(on, settings, 5.0, 2, round_=2), "--init-method").endswith(
        "/rendezvous-5ms-cap0-overlap-r2"
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ms": ()}, "at least one --ms"),
        ({"ms": (-1.0,)}, "--ms must be a finite number >= 0"),
        ({"ms": (5.0, 5.0)}, "--ms values repeat"),
        ({"caps": (0.0, -1.0)}, "bucket cap must be a finite number >= 0"),
        ({"caps": (1.0, 1.0)}, "--caps values repeat"),
        ({"steps": 2}, "--steps must exceed the 2 warm-up steps"),
        ({"nodes": 1}, "--nodes must be >= 2"),
        ({"rounds": 0}, "--rounds must be an integer >= 1"),
        ({"timeline_cap": 3.0}, "--timeline-cap 3 is not one of --caps"),
        ({"shaper": "tc"}, "--shaper must be one of"),
        ({"rate_mbit": 0.0}, "--rate-mbit must be > 0"),
        ({"batch_size": 30}, "must divide evenly over 4 ranks"),
    ],
)
def test_settings_name_the_bad_value(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        SweepSettings(**kwargs)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--caps", "0,x"], "expected comma-separated MB values"),
        (["--ms", "-2"], "must be a finite number >= 0"),
        (["--steps", "2"], "--steps must exceed the 2 warm-up steps"),
        (["--timeline-cap", "3"], "--timeline-cap 3 is not one of --caps"),
        (["--shaper", "tc"], "invalid choice"),
        (["--rate-mbit", "0"], "must be a finite number > 0"),
        (["--rounds", "0"], "--rounds must be an integer >= 1"),
    ],
)
def test_cli_rejects_bad_arguments_before_any_docker_call(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["latency", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_defaults_and_help(capsys):
    args = cli.build_parser().parse_args(["latency", "--ms", "1", "--ms", "5"])
    from lab.latency_cli import settings_from_args

    settings = settings_from_args(args)
    assert settings.ms == (1.0, 5.0)
    assert settings.caps == (0.0, 0.25, 1.0, 4.0, 25.0)
    assert settings_from_args(cli.build_parser().parse_args(["latency"])).ms == (5.0,)
    with pytest.raises(SystemExit):
        cli.main(["latency", "--help"])
    text = capsys.readouterr().out
    assert "overlap gain = the fastest configuration with overlap off" in text


# --- statistics, table, CSV, JSON, plot --------------------------------------------------------


def test_summary_is_the_median_of_the_slowest_rank_after_warmup(tmp_path):
    # Step s, rank r: 100 + r + s, so the slowest rank is 3; warm-up steps are huge.
    slow = write_logs(
        tmp_path / "a", steps=7, step_ms=lambda r, s: 5000.0 if s <= 2 else 100.0 + r + s
    )
    stats = report.summarize_config(slow, warmup=2)
    assert stats.steps_measured == 5
    assert stats.median_step_ms == 100.0 + 3 + 5  # steps 3..7 -> median step 5
    assert stats.median_comm_ms == (100.0 + 3 + 5) / 2
    assert stats.calls == 3


def test_summary_errors_say_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="no rank"):
        report.summarize_config(tmp_path, warmup=2)
    short = write_logs(tmp_path / "short", steps=2)
    with pytest.raises(ValueError, match="run more --steps"):
        report.summarize_config(short, warmup=2)
    old = write_logs(tmp_path / "old")
    for path in old.glob("*.jsonl"):
        path.write_text(path.read_text().replace('"num_buckets"', '"buckets"'))
    with pytest.raises(ValueError, match="rebuild it with `python -m lab image`"):
        report.summarize_config(old, warmup=2)


def test_rounds_pool_their_measured_steps(tmp_path):
    a = write_logs(tmp_path / "r1", steps=5, step_ms=lambda r, s: 10.0 + r)  # 13 x 3 steps
    b = write_logs(tmp_path / "r2", steps=5, step_ms=lambda r, s: 30.0 + r)  # 33 x 3 steps
    c = write_logs(tmp_path / "r3", steps=4, step_ms=lambda r, s: 20.0 + r)  # 23 x 2 steps
    stats = report.summarize_config([a, b, c], warmup=2)
    assert stats.steps_measured == 8
    assert stats.median_step_ms == 23.0
    settings = SweepSettings(caps=(1,), steps=5)
    spec = plan_sweep(settings)[1]
    runs = [
        ConfigRun(spec, 5.0, i + 1, d,
                  report.Row(5.0, spec.label, 1, True, 3, 0.0, 0.0, 0, parity), {}, 1.0)
        for i, (d, parity) in enumerate([(a, True), (b, False), (c, True)])
    ]  # fmt: skip
    (combined,) = combine_rounds(runs, warmup=2)
    assert (combined.median_step_ms, combined.steps_measured) == (23.0, 8)
    assert combined.parity is False  # broken in any round is broken


def test_derived_columns_and_headline():
    rows = report.derive_rows(
        [
            row(5, None, None, 20.0, calls=0),
            row(5, 0, True, 900.0, calls=24),
            row(5, 0, False, 880.0, calls=24),
            row(5, 1, True, 150.0, calls=4),
            row(5, 1, False, 160.0, calls=4),
            row(5, 25, True, 100.0, calls=2),
            row(5, 25, False, 110.0, calls=2, parity=False),
        ]
    )
    by = {(r.cap_mb, r.overlap): r for r in rows}
    assert by[(None, None)].exposed_comm_ms == 0.0
    assert math.isnan(by[(None, None)].speedup_vs_per_parameter)
    assert by[(1, True)].exposed_comm_ms == 130.0
    assert by[(1, True)].speedup_vs_per_parameter == 6.0  # vs per-parameter, overlap on
    assert by[(1, False)].speedup_vs_per_parameter == 5.5  # vs per-parameter, overlap off
    h = report.headline(rows, 5)
    assert h.bucketing_speedup == 880.0 / 100.0  # best per-parameter vs best bucketed
    assert h.overlap_gain == 110.0 / 100.0  # best overlap-off vs best overlap-on
    assert (h.per_parameter, h.best_bucketed) == ("0-False", "25-True")
    line = report.headline_line(h)
    assert HEADLINE.match(line), line
    assert line == (
        "bucketing speedup at 5 ms: 8.8x (per-parameter vs best bucketed), overlap gain: 1.1x"
    )
    table = report.format_table(rows)
    assert "link delay 5 ms one-way:" in table
    assert "n/a (no sync)" in table and "BROKEN" in table and "6.0x" in table
    assert default_timeline_cap(rows, 5) == 25


def test_headline_is_nan_when_a_side_was_not_run():
    h = report.headline([row(1, 0, True, 50.0)], 1)
    assert math.isnan(h.bucketing_speedup) and math.isnan(h.overlap_gain)
    assert "nanx" in report.headline_line(h)


def test_csv_json_and_plot(tmp_path):
    rows = report.derive_rows(
        [row(ms, cap, ov, 10.0 * (1 + ms) * (2 if cap == 0 else 1), calls=24 if cap == 0 else 2)
         for ms in (1, 5) for cap, ov in [(None, None), (0, True), (0, False), (4, True),
                                          (4, False)]]
    )  # fmt: skip
    report.write_csv(tmp_path / "l.csv", rows)
    with open(tmp_path / "l.csv") as f:
        got = list(csv.DictReader(f))
    assert len(got) == 10
    assert got[0]["parity"] == "n/a (no sync)" and got[0]["bucket_cap_mb"] == ""
    assert got[1]["allreduce_calls_per_step"] == "24" and got[1]["parity"] == "holds"
    heads = [report.headline(rows, ms) for ms in (1, 5)]
    report.write_json(tmp_path / "l.json", rows, heads, {"run_id": "r"})
    doc = json.loads((tmp_path / "l.json").read_text())  # NaN would not parse as strict JSON
    assert doc["run_id"] == "r" and len(doc["rows"]) == 10 and len(doc["headline"]) == 2
    assert doc["rows"][0]["speedup_vs_per_parameter"] is None
    assert set(doc["definitions"]) >= {"bucketing speedup", "overlap gain"}
    report.plot_sweep(tmp_path / "l.png", rows)
    assert (tmp_path / "l.png").read_bytes()[:8] == PNG


# --- timeline ---------------------------------------------------------------------------------


def test_representative_step_is_the_one_closest_to_the_median(tmp_path):
    times = {3: 50.0, 4: 90.0, 5: 60.0, 6: 500.0, 7: 55.0}
    d = write_logs(tmp_path / "a", steps=7, step_ms=lambda r, s: times.get(s, 9999.0) + r)
    assert timeline.representative_step(d, warmup=2) == 5  # median of 53,93,63,503,58 is 63
    floor = write_logs(tmp_path / "f", sync="none")
    with pytest.raises(ValueError, match="no measured step with a timeline"):
        timeline.representative_step(floor, warmup=2)


def test_step_timeline_aligns_ranks_on_the_earliest_start(tmp_path):
    d = write_logs(tmp_path / "a", buckets=2)
    tl = timeline.load_step(d, 3, "cap 1 MB, overlap on")
    assert sorted(tl.ranks) == [0, 1, 2, 3]
    assert tl.ranks[0].offset_ms == 0.0
    assert tl.ranks[3].offset_ms == pytest.approx(6.0, abs=1e-6)  # t0 2 ms apart per rank
    assert tl.ranks[1].buckets_ms == [(3.0, 40.0), (5.0, 60.0)]
    assert tl.end_ms == pytest.approx(6.0 + 100 + 3 + 3, abs=1e-6)


def test_lanes_never_overlap():
    intervals = [(0, 10), (2, 5), (6, 8), (10, 12), (3, 20)]
    lanes = timeline._lanes(intervals)
    for lane in set(lanes):
        mine = sorted(iv for iv, ln in zip(intervals, lanes, strict=True) if ln == lane)
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(mine))
    assert lanes == [0, 1, 1, 0, 2]


def test_chrome_trace_has_every_phase_and_bucket_properly_nested(tmp_path):
    on = timeline.load_step(write_logs(tmp_path / "on", buckets=3), 4, "overlap on")
    off = timeline.load_step(write_logs(tmp_path / "off", buckets=3), 4, "overlap off")
    trace = json.loads(json.dumps(timeline.chrome_trace([on, off])))
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == 2 * 4 * (3 + 3)  # 2 configs x 4 ranks x (3 phases + 3 buckets)
    names = {e["name"] for e in spans}
    assert {"forward", "backward", "allreduce bucket 0", "allreduce bucket 2"} <= names
    backward = next(e for e in spans if e["name"] == "backward" and e["pid"] == 1)
    assert (backward["ts"], backward["dur"]) == (pytest.approx(2000.0), pytest.approx(8000.0))
    # Slices on one thread must not partly overlap, or trace viewers misdraw them.
    threads: dict = {}
    for e in spans:
        threads.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for slices in threads.values():
        slices.sort()
        assert all(a[1] <= b[0] + 1e-6 for a, b in itertools.pairwise(slices))
    meta = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert meta == {"overlap on (step 4)", "overlap off (step 4)"}
    assert trace["displayTimeUnit"] == "ms"


def test_gantt_png(tmp_path):
    on = timeline.load_step(write_logs(tmp_path / "on"), 4, "overlap on")
    off = timeline.load_step(write_logs(tmp_path / "off"), 4, "overlap off")
    timeline.write_gantt(tmp_path / "g.png", [on, off], suptitle="test")
    assert (tmp_path / "g.png").read_bytes()[:8] == PNG
    with pytest.raises(ValueError, match="no timelines"):
        timeline.write_gantt(tmp_path / "none.png", [])


def test_write_outputs_from_collected_logs(tmp_path):
    settings = SweepSettings(caps=(0, 1), steps=6, rounds=2)
    result = SweepResult("r1", tmp_path)
    for spec, round_ in [(s, k) for k in (1, 2) for s in plan_sweep(settings)]:
        per_call = 30.0 * (24 if spec.cap_mb == 0 else 4) if spec.cap_mb is not None else 0.0
        d = write_logs(
            tmp_path / "logs" / run_name(spec, 5.0, round_),
            buckets=24 if spec.cap_mb == 0 else 4,
            sync="none" if spec.is_floor else "allreduce",
            parity=not spec.is_floor,
            step_ms=lambda r, s, base=per_call + 20.0: base + r,
        )
        stats = report.summarize_config(d, settings.warmup)
        r = report.Row(5.0, spec.label, spec.cap_mb, spec.overlap, stats.calls,
                       stats.median_step_ms, stats.median_comm_ms, stats.steps_measured,
                       None if spec.is_floor else True)  # fmt: skip
        result.runs.append(ConfigRun(spec, 5.0, round_, d, r, {0: 0}, 1.0))
    out = write_outputs(result, settings)
    assert [f.name for f in out.files] == [
        "latency.csv", "latency.png", "trace.json", "gantt.png", "latency.json"
    ]  # fmt: skip
    assert all(f.exists() and f.stat().st_size > 0 for f in out.files)
    doc = json.loads((tmp_path / "latency.json").read_text())
    assert doc["timeline"]["cap_mb"] == 1.0
    assert doc["headline"][0]["bucketing_speedup"] == pytest.approx(743 / 143)  # slowest +3
    assert HEADLINE.match(report.headline_line(out.headlines[0]))
    assert len(doc["rows"]) == 5 and doc["rows"][1]["steps_measured"] == 8  # 2 rounds x 4
    assert len(doc["runs"]) == 10
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert len({e["pid"] for e in trace["traceEvents"]}) == 4  # every allreduce configuration


def test_runspec_floor_has_no_cap():
    floor = RunSpec(None)
    assert floor.is_floor and floor.name == "nosync" and floor.label == "no sync (floor)"


def test_overlap_gain_per_cap_line():
    from lab.report import Row, overlap_by_cap_line

    rows = [
        Row(5.0, "floor", None, None, 0, 100.0, 0.0, 10, None),
        Row(5.0, "pp on", 0.0, True, 24, 837.6, 1.0, 10, True),
        Row(5.0, "pp off", 0.0, False, 24, 954.7, 1.0, 10, True),
        Row(5.0, "1 on", 1.0, True, 4, 218.4, 1.0, 10, True),
        Row(5.0, "1 off", 1.0, False, 4, 273.4, 1.0, 10, True),
    ]
    assert overlap_by_cap_line(rows, 5.0) == (
        "overlap gain per cap at 5 ms: per-parameter 1.14x, 1 MB 1.25x"
    )


def test_simulated_backward_compute_reaches_every_configuration():
    from lab.sweep import SweepSettings, plan_sweep

    settings = SweepSettings(caps=(0.0, 1.0), backward_ms=120)
    for spec in plan_sweep(settings):
        flags = spec.ddp_flags(settings)
        assert flags[flags.index("--backward-delay-ms") + 1] == "120"
    assert "--backward-delay-ms" not in plan_sweep(SweepSettings())[1].ddp_flags(SweepSettings())
    with pytest.raises(ValueError, match="--backward-ms"):
        SweepSettings(backward_ms=-1)
