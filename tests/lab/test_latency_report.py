"""``lab latency``'s figures without Docker: statistics, table, CSV, JSON, plot, Chrome trace
and Gantt chart, all from synthetic logs written with ``ddp.program.records`` and read back with
``ddp.program.records.load_run``, as the collected logs of a run are."""

from __future__ import annotations

import csv
import itertools
import json
import math
import re
from pathlib import Path

import pytest

from ddp.program.records import load_run
from lab.experiments import latency, timeline
from lab.experiments.latency import (
    TRAIN_DEFAULTS,
    ConfigRun,
    ConfigStats,
    LatencyPlan,
    Row,
    SweepResult,
    derive_rows,
    summarize,
)
from tests.lab.latency_logs import write_logs

PNG = b"\x89PNG\r\n\x1a\n"
HEADLINE = re.compile(
    r"^bucketing speedup at \d+(\.\d+)? ms: \d+\.\dx \(per-parameter vs best bucketed\), "
    r"overlap gain: \d+\.\dx$"
)


def _logs(path: Path, **kw) -> list[tuple[str, dict]]:
    return [(str(path), load_run(write_logs(path, **kw)))]


def row(ms, cap, overlap, median, calls=1, parity=True):
    return Row(
        ms,
        "x" if cap is None else f"{cap}-{overlap}",
        cap,
        overlap,
        calls,
        median,
        median / 2,
        10,
        None if cap is None else parity,
    )


# --- statistics ------------------------------------------------------------------------------


def test_summary_is_the_median_of_the_slowest_rank_after_warmup(tmp_path):
    # Step s, rank r: 100 + r + s, so the slowest rank is 3; warm-up steps are huge.
    logs = _logs(tmp_path, steps=7, step_ms=lambda r, s: 5000.0 if s <= 2 else 100.0 + r + s)
    stats = summarize(logs, warmup=2)
    assert stats == ConfigStats(
        calls=3, median_step_ms=108.0, median_comm_ms=54.0, steps_measured=5
    )


def test_summary_errors_say_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="no rank logs"):
        summarize([(str(tmp_path), load_run(tmp_path))], warmup=2)
    with pytest.raises(ValueError, match="run more --steps"):
        summarize(_logs(tmp_path / "short", steps=2), warmup=2)


def test_a_torn_last_line_is_dropped_not_a_crash(tmp_path):
    d = write_logs(tmp_path, steps=5)
    with open(d / "rank2.jsonl", "a") as f:
        f.write('{"event": "step", "rank": 2, "st')  # a rank killed mid-write
    logs = load_run(d)
    assert logs[2].torn and summarize([("d", logs)], warmup=2).steps_measured == 3


def _result(tmp_path: Path, rounds: int, step_ms, parity=lambda conf, r: True) -> SweepResult:
    """A finished sweep at 5 ms over caps 0 and 1, its logs where the cluster collects them."""
    plan = LatencyPlan(caps=(0, 1), rounds=rounds, train=TRAIN_DEFAULTS.replace(steps=6))
    result = SweepResult(plan, "r1", tmp_path)
    for p in plan.jobs(5.0):
        conf = p.conf
        d = write_logs(
            tmp_path / p.job / "logs",
            buckets=24 if conf.cap_mb == 0 else 4,
            sync="none" if conf.is_floor else "allreduce",
            parity=not conf.is_floor,
            step_ms=lambda r, s, conf=conf, k=p.round: step_ms(conf, k) + r,
        )
        stats = summarize([(p.job, load_run(d))], plan.warmup)
        ok = None if conf.is_floor else parity(conf, p.round)
        result.runs.append(ConfigRun(conf, 5.0, p.round, p.job, {0: 0}, stats, ok, 1.0))
    return result


def test_rounds_pool_their_measured_steps_and_parity_must_hold_in_every_round(tmp_path):
    # Round 1 at 10 (+rank), round 2 at 30: 4 measured steps each, pooled median 23 (13/33).
    def broken_once(conf, k):
        return not (conf.cap_mb == 1 and conf.overlap and k == 2)

    result = _result(tmp_path, 2, lambda conf, k: 10.0 if k == 1 else 30.0, broken_once)
    rows = {r.config: r for r in latency.combine_rounds(result)}
    cap1 = rows["cap 1 MB, overlap on"]
    assert (cap1.median_step_ms, cap1.steps_measured, cap1.parity) == (23.0, 8, False)
    assert rows["cap 1 MB, overlap off"].parity is True
    assert rows["no sync (floor)"].parity is None


def test_derived_columns_headline_and_table():
    rows = derive_rows(
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
    h = latency.headline(rows, 5)
    assert h.bucketing_speedup == 880.0 / 100.0  # best per-parameter vs best bucketed
    assert h.overlap_gain == 110.0 / 100.0  # best overlap-off vs best overlap-on
    assert (h.per_parameter, h.best_bucketed) == ("0-False", "25-True")
    assert latency.headline_line(h) == (
        "bucketing speedup at 5 ms: 8.8x (per-parameter vs best bucketed), overlap gain: 1.1x"
    )
    table = latency.format_table(rows, rate_mbit=100, backward_ms=120)
    assert "link delay 5 ms one-way, rate 100 Mbit/s, simulated backward compute 120 ms" in table
    assert "n/a (no sync)" in table and "BROKEN" in table and "6.0x" in table
    assert latency.default_timeline_cap(rows, 5) == 25
    # One bucket has nothing to overlap: the Gantt chart shows the fastest cap with several.
    one = derive_rows([row(5, 1, True, 150.0, calls=4), row(5, 25, True, 100.0, calls=1)])
    assert latency.default_timeline_cap(one, 5) == 1
    assert latency.default_timeline_cap(one[1:], 5) == 25  # unless there is none


def test_headline_is_nan_when_a_side_was_not_run_and_the_line_says_which():
    h = latency.headline([row(1, 0, True, 50.0)], 1)
    assert math.isnan(h.bucketing_speedup) and math.isnan(h.overlap_gain)
    assert latency.headline_line(h) == (
        "bucketing speedup at 1 ms: n/a (--caps has no 0 or no bucketed cap) (per-parameter vs "
        "best bucketed), overlap gain: n/a (overlap on and off not both run)"
    )
    only_buckets = latency.headline([row(1, 1, True, 50.0), row(1, 1, False, 60.0)], 1)
    assert latency.headline_line(only_buckets).endswith("overlap gain: 1.2x")


def test_overlap_gain_per_cap_line():
    rows = [
        row(5.0, None, None, 100.0),
        row(5.0, 0.0, True, 837.6),
        row(5.0, 0.0, False, 954.7),
        row(5.0, 1.0, True, 218.4),
        row(5.0, 1.0, False, 273.4),
    ]
    assert latency.overlap_by_cap_line(rows, 5.0) == (
        "overlap gain per cap at 5 ms: per-parameter 1.14x, 1 MB 1.25x"
    )


def test_describe_a_finished_configuration(tmp_path):
    run = _result(tmp_path, 1, lambda conf, k: 50.0).runs[1]
    line = latency.describe(run, 2, 5)
    assert line.startswith("[ 2/5] 5 ms round 1  per-parameter, overlap on")
    assert "24 allreduce/step  median step     53.0 ms  parity holds  (1 s)" in line


def test_csv_json_and_plot(tmp_path):
    rows = derive_rows(
        [
            row(ms, cap, ov, 10.0 * (1 + ms) * (2 if cap == 0 else 1), calls=24 if cap == 0 else 2)
            for ms in (1, 5)
            for cap, ov in [(None, None), (0, True), (0, False), (4, True), (4, False)]
        ]
    )
    latency.write_csv(tmp_path / "l.csv", rows)
    with open(tmp_path / "l.csv") as f:
        got = list(csv.DictReader(f))
    assert len(got) == 10
    assert got[0]["parity"] == "n/a (no sync)" and got[0]["bucket_cap_mb"] == ""
    assert got[1]["allreduce_calls_per_step"] == "24" and got[1]["parity"] == "holds"
    heads = [latency.headline(rows, ms) for ms in (1, 5)]
    latency.write_json(tmp_path / "l.json", rows, heads, {"run_id": "r", "dir": tmp_path})
    doc = json.loads((tmp_path / "l.json").read_text())  # NaN would not parse as strict JSON
    assert doc["run_id"] == "r" and len(doc["rows"]) == 10 and len(doc["headline"]) == 2
    assert doc["rows"][0]["speedup_vs_per_parameter"] is None and doc["dir"] == str(tmp_path)
    assert set(doc["definitions"]) >= {"bucketing speedup", "overlap gain"}
    latency.plot_sweep(tmp_path / "l.png", rows)
    assert (tmp_path / "l.png").read_bytes()[:8] == PNG


# --- timeline ---------------------------------------------------------------------------------


def test_representative_step_is_the_one_closest_to_the_median(tmp_path):
    times = {3: 50.0, 4: 90.0, 5: 60.0, 6: 500.0, 7: 55.0}
    logs = load_run(
        write_logs(tmp_path / "a", steps=7, step_ms=lambda r, s: times.get(s, 9999.0) + r)
    )
    assert timeline.representative_step(logs, warmup=2) == 5  # median of 53,93,63,503,58 is 63
    floor = load_run(write_logs(tmp_path / "f", sync="none"))
    with pytest.raises(ValueError, match="no measured step with a timeline"):
        timeline.representative_step(floor, warmup=2)


def test_step_timeline_aligns_ranks_on_the_earliest_start(tmp_path):
    tl = timeline.load_step(load_run(write_logs(tmp_path, buckets=2)), 3, "cap 1 MB, overlap on")
    assert sorted(tl.ranks) == [0, 1, 2, 3]
    assert tl.ranks[0].offset_ms == 0.0
    assert tl.ranks[3].offset_ms == pytest.approx(6.0, abs=1e-6)  # t0 2 ms apart per rank
    assert tl.ranks[1].buckets_ms == [(3.0, 40.0), (5.0, 60.0)]
    assert tl.end_ms == pytest.approx(6.0 + 100 + 3 + 3, abs=1e-6)
    with pytest.raises(ValueError, match="rank 0 has no timeline for step 99"):
        timeline.load_step(load_run(tmp_path), 99, "x")


def test_lanes_never_overlap():
    intervals = [(0, 10), (2, 5), (6, 8), (10, 12), (3, 20)]
    lanes = timeline._lanes(intervals)
    for lane in set(lanes):
        mine = sorted(iv for iv, ln in zip(intervals, lanes, strict=True) if ln == lane)
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(mine))
    assert lanes == [0, 1, 1, 0, 2]


def test_chrome_trace_has_every_phase_and_bucket_properly_nested(tmp_path):
    on = timeline.load_step(load_run(write_logs(tmp_path / "on")), 4, "overlap on")
    off = timeline.load_step(load_run(write_logs(tmp_path / "off")), 4, "overlap off")
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
    on = timeline.load_step(load_run(write_logs(tmp_path / "on")), 4, "overlap on")
    off = timeline.load_step(load_run(write_logs(tmp_path / "off")), 4, "overlap off")
    timeline.write_gantt(tmp_path / "g.png", [on, off], suptitle="test")
    assert (tmp_path / "g.png").read_bytes()[:8] == PNG
    with pytest.raises(ValueError, match="no timelines"):
        timeline.write_gantt(tmp_path / "none.png", [])


def test_the_files_from_collected_logs(tmp_path):
    # Per-parameter: 24 calls x 30 ms; cap 1: 4 calls x 30 ms; everything + 20 ms of compute.
    def step_ms(conf, k):
        return 20.0 + (0.0 if conf.is_floor else 30.0 * (24 if conf.cap_mb == 0 else 4))

    result = _result(tmp_path, 2, step_ms)
    summary = latency.analyse(result)
    files = latency.write_files(summary)
    assert [f.name for f in files] == [
        "latency.csv",
        "latency.png",
        "trace.json",
        "gantt.png",
        "latency.json",
    ]
    assert all(f.exists() and f.stat().st_size > 0 for f in files)
    doc = json.loads((tmp_path / "latency.json").read_text())
    assert doc["timeline"]["cap_mb"] == 1.0
    # The Gantt chart's pair, per bucket (synthetic logs: 4 buckets, backward from 2 to 10 ms).
    assert [(t.config, t.overlap) for t in summary.gantt.timings] == [
        ("cap 1 MB, overlap on", True),
        ("cap 1 MB, overlap off", False),
    ]
    assert [b["comm_ms"] for b in doc["bucket_timings"][0]["buckets"]] == [37.0, 55.0, 73.0, 91.0]
    assert doc["bucket_timings"][1]["buckets"][0]["compute_ms"] is None
    assert doc["headline"][0]["bucketing_speedup"] == pytest.approx(743 / 143)  # slowest +3
    assert HEADLINE.match(latency.headline_line(summary.headlines[0]))
    assert len(doc["rows"]) == 5 and doc["rows"][1]["steps_measured"] == 8  # 2 rounds x 4
    assert len(doc["runs"]) == 10 and doc["runs"][0]["name"] == "5ms-nosync-r1"
    assert doc["settings"]["train"]["model"] == "tower" and doc["settings"]["caps"] == [0, 1]
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert len({e["pid"] for e in trace["traceEvents"]}) == 4  # every allreduce configuration
