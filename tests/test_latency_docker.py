"""Docker tier: ``python -m lab latency`` end to end -- real containers, real delayed packets
(netem, or the NFQUEUE delayer on kernels without it), real gloo ranks -- on a small sweep, and
nothing labelled ``lab.run`` left behind. Run with ``pytest -m docker``."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from lab.specs import LABEL

from tests.helpers import leftovers

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(600)
def test_latency_small_sweep_end_to_end(client, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "lab", "latency", "--ms", "5", "--caps", "0,1", "--steps", "5",
         "--rounds", "1", "--timeout", "200", "--runs-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=560,
    )  # fmt: skip
    out = proc.stdout
    assert proc.returncode == 0, f"stdout:\n{out}\nstderr:\n{proc.stderr}"
    run_id = re.search(r"^run (\S+):", out, re.M).group(1)
    assert leftovers(client, f"{LABEL}={run_id}") == []

    # The link was verified before anything was measured: asked vs measured round trip.
    rtt = re.search(r"asked 5 ms one-way \(round trip \+10 ms\).*round trip p50 ([\d.]+) ms", out)
    assert rtt, out
    assert 8.0 <= float(rtt.group(1)) <= 12.5  # within the shaping's own 20% check (+ bridge)

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
        "no sync (floor)", "per-parameter, overlap on", "per-parameter, overlap off",
        "cap 1 MB, overlap on", "cap 1 MB, overlap off",
    }  # fmt: skip
    assert rows["per-parameter, overlap on"]["allreduce_calls_per_step"] == "24"  # deep: 24 tensors
    assert rows["cap 1 MB, overlap off"]["allreduce_calls_per_step"] == "4"
    assert all(r["parity"] == "holds" for c, r in rows.items() if c != "no sync (floor)")
    doc = json.loads((run_dir / "latency.json").read_text())
    assert doc["links"][0]["rtt_p50_ms"] == pytest.approx(float(rtt.group(1)), abs=0.01)
    trace = json.loads((run_dir / "trace.json").read_text())
    names = {e["name"] for e in trace["traceEvents"]}
    assert {"backward", "allreduce bucket 0", "allreduce bucket 23"} <= names
    for png in ("latency.png", "gantt.png"):
        assert (run_dir / png).read_bytes()[:8] == PNG
    assert len(list((run_dir / "logs").glob("5ms-*-r1/rank*.jsonl"))) == 5 * 4
