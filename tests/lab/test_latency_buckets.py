"""``lab latency``'s per-bucket figures and the Gantt chart's bucket pieces, from synthetic logs
written with ``ddp.torchfree`` (``tests/lab/latency_logs.py``: backward from 2 to 10 ms, bucket k
in flight from 3+2k to 40+20k ms)."""

from __future__ import annotations

import itertools
import json

import pytest

from ddp.program.records import load_run
from lab.experiments import timeline
from lab.experiments.latency import format_timing
from lab.measure.buckets import time_buckets
from tests.lab.latency_logs import write_logs


def test_bucket_timings_are_medians_relative_to_backward_start(tmp_path):
    logs = load_run(write_logs(tmp_path, steps=6, buckets=3))
    t = time_buckets(logs, warmup=2, config="cap 1 MB, overlap on", overlap=True)
    assert t.samples == 4 * 4  # 4 ranks x steps 3..6
    assert (t.forward_ms, t.backward_ms) == (2.0, 8.0)
    assert [b.launch_ms for b in t.buckets] == [1.0, 3.0, 5.0]
    assert [b.compute_ms for b in t.buckets] == [1.0, 2.0, 2.0]  # launch minus the previous
    assert [b.comm_ms for b in t.buckets] == [37.0, 55.0, 73.0]
    assert [b.after_backward_ms for b in t.buckets] == [30.0, 50.0, 70.0]
    assert t.comm_ms == 165.0
    assert t.step_ms == pytest.approx(100.0 + 3 + 4.5)  # slowest rank (3), median of steps 3..6
    block = format_timing(t)
    assert block.splitlines()[0].startswith("cap 1 MB, overlap on: forward 2.0 ms, backward 8.0")
    assert block.splitlines()[2].split() == ["b0", "1.0", "1.0", "37.0", "30.0"]


def test_without_overlap_the_fill_time_is_not_claimed(tmp_path):
    logs = load_run(write_logs(tmp_path, buckets=2))
    t = time_buckets(logs, warmup=2, config="off", overlap=False)
    assert [b.compute_ms for b in t.buckets] == [None, None]
    assert format_timing(t).splitlines()[2].split()[1] == "-"


def test_bucket_timings_need_a_timeline(tmp_path):
    floor = load_run(write_logs(tmp_path, sync="none"))
    with pytest.raises(ValueError, match="no measured step with a bucket timeline"):
        time_buckets(floor, warmup=2, config="floor", overlap=True, where="job x")


def test_backward_is_cut_where_each_bucket_was_launched():
    r = timeline.RankStep(0.0, (10.0, 50.0), [(20.0, 90.0), (35.0, 95.0), (48.0, 99.0)], 100.0)
    assert timeline.backward_pieces(r) == [
        ("b0", 10.0, 20.0),
        ("b1", 20.0, 35.0),
        ("b2", 35.0, 50.0),
    ]
    # Buckets launched after backward (by the final callback) get empty pieces at its end.
    late = timeline.RankStep(0.0, (10.0, 50.0), [(30.0, 90.0), (60.0, 95.0), (61.0, 99.0)], 100.0)
    assert timeline.backward_pieces(late) == [
        ("b0", 10.0, 30.0),
        ("b1", 30.0, 50.0),
        ("b2", 50.0, 50.0),
    ]


def test_overlap_on_trace_nests_the_pieces_inside_backward(tmp_path):
    logs = load_run(write_logs(tmp_path, buckets=3))
    on = timeline.load_step(logs, 4, "overlap on", overlap=True)
    off = timeline.load_step(logs, 4, "overlap off", overlap=False)
    spans = [e for e in timeline.chrome_trace([on, off])["traceEvents"] if e["ph"] == "X"]
    pieces = [e for e in spans if e["name"].startswith("backward b")]
    assert len(pieces) == 4 * 3 and {e["pid"] for e in pieces} == {1}  # overlap on only
    threads: dict = {}
    for e in spans:
        if e["name"] != "backward":  # the pieces nest inside it; the rest must not overlap
            threads.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for slices in threads.values():
        slices.sort()
        assert all(a[1] <= b[0] + 1e-6 for a, b in itertools.pairwise(slices))
    timeline.write_gantt(tmp_path / "g.png", [on, off])
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    json.dumps(timeline.chrome_trace([on]))  # serialisable
