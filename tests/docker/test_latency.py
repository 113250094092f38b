"""Docker tier: ``python -m lab latency`` end to end -- real containers, real delayed packets
(netem, or the NFQUEUE delayer on kernels without it), real gloo ranks -- on a small sweep, and
nothing labelled ``lab.run`` left behind. Run with ``pytest -m docker tests/docker``."""

from __future__ import annotations

import csv
import json
import re

import pytest

from ddp.program.records import load_run
from lab.engine.specs import LABEL
from tests.docker.lab_run import PNG, lab, run_lab
from tests.helpers import leftovers

pytestmark = pytest.mark.docker


@pytest.mark.timeout(900)
def test_latency_small_sweep_end_to_end(client, tmp_path):
    argv = (
        "latency --ms 5 --caps 0,1 --steps 5 --rounds 1 --run-timeout 200 --collective-timeout 60"
    )
    out, run_id = run_lab(client, [*argv.split(), "--runs-dir", str(tmp_path)], 860)
    assert f"labelled lab.run={run_id}" in out  # the cluster said what it removed

    # The link was verified before anything was measured: asked vs measured round trip.
    rtt = re.search(  # the default rate cap is on
        r"asked 5 ms one-way \(round trip \+10 ms\), rate 20 Mbit/s.*"
        r"round trip p50 ([\d.]+) ms",
        out,
    )
    assert rtt, out
    assert 8.0 <= float(rtt.group(1)) <= 12.5  # within the shaping's own 20% check (+ bridge)
    # A line per finished configuration, and progress while each ran.
    assert len(re.findall(r"^\[ ?\d/5\] 5 ms round 1 ", out, re.M)) == 5, out
    assert re.search(r"^progress: step 5/5", out, re.M), out

    lines = out.strip().splitlines()
    assert re.fullmatch(
        r"bucketing speedup at 5 ms: \d+\.\dx \(per-parameter vs best bucketed\), "
        r"overlap gain: \d+\.\dx",
        lines[-1],
    ), lines[-1]

    run_dir = tmp_path / run_id
    with open(run_dir / "latency.csv") as f:
        rows = {r["config"]: r for r in csv.DictReader(f)}
    assert set(rows) == {
        "no sync (floor)",
        "per-parameter, overlap on",
        "per-parameter, overlap off",
        "cap 1 MB, overlap on",
        "cap 1 MB, overlap off",
    }
    assert rows["per-parameter, overlap on"]["allreduce_calls_per_step"] == "82"  # 82 tensors
    assert rows["cap 1 MB, overlap off"]["allreduce_calls_per_step"] == "2"
    assert all(r["parity"] == "holds" for c, r in rows.items() if c != "no sync (floor)")
    doc = json.loads((run_dir / "latency.json").read_text())
    assert doc["links"][0]["rtt_p50_ms"] == pytest.approx(float(rtt.group(1)), abs=0.01)
    assert doc["settings"]["train"]["collective_timeout_s"] == 60.0
    trace = json.loads((run_dir / "trace.json").read_text())
    names = {e["name"] for e in trace["traceEvents"]}
    assert {"backward", "allreduce bucket 0", "allreduce bucket 81", "backward b1"} <= names
    # The Gantt chart's pair, per bucket: the compute that filled each and its allreduce.
    assert "per bucket, round 1 at 5 ms (the Gantt chart's pair):" in out
    assert re.search(r"^cap 1 MB, overlap on: forward [\d.]+ ms, backward [\d.]+ ms", out, re.M)
    assert re.search(r"^  b1 +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+$", out, re.M), out
    assert [t["overlap"] for t in doc["bucket_timings"]] == [True, False]
    for png in ("latency.png", "gantt.png"):
        assert (run_dir / png).read_bytes()[:8] == PNG
    # Every configuration's job: 2 rank logs (the default nodes) with end records, and each
    # node's output (beside them, tb/ holds the report's scalars).
    jobs = sorted(p.name for p in run_dir.iterdir() if p.is_dir() and p.name != "tb")
    assert len(jobs) == 5 and all(j.startswith("5ms-") and j.endswith("-r1") for j in jobs)
    for job in jobs:
        logs = load_run(run_dir / job / "logs")
        assert sorted(logs) == [0, 1] and all(log.end for log in logs.values()), job
        assert len(list((run_dir / job).glob("node*.log"))) == 2


@pytest.mark.timeout(300)
def test_a_link_that_is_not_what_was_asked_stops_the_run_and_cleans_up(client, tmp_path):
    # 1 us one-way is far below what a userspace delayer (or the bridge's jitter) can hold to
    # 20%: the check must refuse it before anything is measured, and the run must still go.
    argv = ["latency", "--ms", "0.001", "--caps", "1", "--steps", "3", "--rounds", "1"]
    proc = lab(*argv, "--runs-dir", str(tmp_path), timeout=280)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "link check failed at 0.001 ms, nothing was measured" in proc.stderr, proc.stderr
    run_id = re.search(r"^run (\S+):", proc.stdout, re.M).group(1)
    assert leftovers(client, f"{LABEL}={run_id}") == []
    assert not list((tmp_path / run_id).glob("*/logs"))  # no configuration ran
