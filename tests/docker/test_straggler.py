"""Docker tier: ``python -m lab straggler --quick`` end to end -- real containers, one under a
real CPU quota, real gloo ranks -- its table, files and headline, and nothing labelled
``lab.run`` left behind. Run with ``pytest -m docker tests/docker/test_straggler.py``."""

from __future__ import annotations

import csv
import json
import re

import pytest

from ddp.program.records import load_run
from tests.docker.lab_run import PNG, run_lab

pytestmark = pytest.mark.docker


@pytest.mark.timeout(600)
def test_straggler_quick_end_to_end(client, tmp_path):
    argv = "straggler --quick --rank 2 --slowdown 8 --run-timeout 240"
    out, run_id = run_lab(client, [*argv.split(), "--runs-dir", str(tmp_path)], 560)
    assert f"labelled lab.run={run_id}" in out
    assert "node2: CPU quota 0.0625 cores" in out
    assert re.search(r"^progress: step 8/8", out, re.M), out
    headline = out.strip().splitlines()[-1]
    m = re.fullmatch(
        r"straggler rank 2: its compute ([\d.]+)x slower, every rank's step ([\d.]+)x "
        r"\(([\d.]+) -> ([\d.]+) ms\); the others wait ([\d.]+) ms per step in allreduce",
        headline,
    )
    assert m, headline
    # A real quota of 1/8 of the fair share slows the rank's compute, and with it every step.
    assert float(m.group(1)) > 1.5 and float(m.group(2)) > 1.2, headline

    run_dir = tmp_path / run_id
    with open(run_dir / "straggler.csv") as f:
        rows = {int(r["rank"]): r for r in csv.DictReader(f)}
    assert sorted(rows) == [0, 1, 2, 3] and rows[2]["straggler"] == "True"
    # Every rank's step rose, not only the straggler's: the allreduce is a barrier.
    assert all(float(r["vs_baseline"]) > 1.1 for r in rows.values()), rows
    doc = json.loads((run_dir / "straggler.json").read_text())
    assert doc["settings"]["quota_cpus"] == 0.0625
    assert {"baseline", "straggler"} == set(doc["jobs"])
    trace = json.loads((run_dir / "trace.json").read_text())
    assert {"forward", "backward", "allreduce bucket 0"} <= {
        e["name"] for e in trace["traceEvents"]
    }
    assert (run_dir / "gantt.png").read_bytes()[:8] == PNG
    for job in ("baseline", "straggler"):
        logs = load_run(run_dir / job / "logs")
        assert sorted(logs) == [0, 1, 2, 3] and all(log.end for log in logs.values()), job
        assert len(list((run_dir / job).glob("node*.log"))) == 4


@pytest.mark.timeout(600)
def test_a_slow_link_is_shaped_only_into_the_straggler_and_verified(client, tmp_path):
    argv = "straggler --quick --rank 3 --slow-link-ms 10 --batch-size 256 --run-timeout 240"
    out, run_id = run_lab(client, [*argv.split(), "--runs-dir", str(tmp_path)], 560)
    assert "CPU quota" not in out  # a slow link alone
    # Verified from the straggler's node before the slowed job ran (within 20%, + the bridge).
    m = re.search(
        r"asked node3 10 ms, others 0 ms one-way \(round trip node3-node0 \+10 ms\); "
        r"measured round trip p50 ([\d.]+) ms",
        out,
    )
    assert m and 8.0 <= float(m.group(1)) <= 12.5, out
    assert out.strip().splitlines()[-1].startswith("straggler rank 3: its link slower, every")
    doc = json.loads((tmp_path / run_id / "straggler.json").read_text())
    assert doc["settings"]["slow_link_ms"] == 10.0 and doc["links"], doc["links"]
