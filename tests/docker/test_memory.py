"""Docker tier: ``python -m lab memory --quick --nodes 2`` end to end -- real containers, real
gloo ranks, a real memory limit -- DDP with Adam, ours sharded and torch's ZeRO measured, then
DDP with Adam killed by the kernel for memory (the engine's oom event) where the sharded run
finishes with parity; its table, files and headline, and nothing labelled ``lab.run`` left
behind. Run with ``pytest -m docker tests/docker/test_memory.py``."""

from __future__ import annotations

import csv
import json
import re

import pytest

from ddp.program.records import load_run
from tests.docker.lab_run import run_lab

pytestmark = pytest.mark.docker


@pytest.mark.timeout(1500)
def test_memory_quick_end_to_end(client, tmp_path):
    argv = "memory --quick --nodes 2 --no-progress --run-timeout 400"
    out, run_id = run_lab(client, [*argv.split(), "--runs-dir", str(tmp_path)], 1450)
    headline = out.strip().splitlines()[-1]
    m = re.fullmatch(
        r"sharded optimizer at 2 ranks: optimizer state ([\d.]+)x per rank \(torch ZeRO: "
        r"([\d.]+)x\), link bytes ([\d.]+)x DDP \(torch ZeRO: ([\d.]+)x\), step time "
        r"([\d.]+)x DDP \(torch ZeRO: ([\d.]+)x\); fits in (\d+) MiB where DDP\+Adam was killed",
        headline,
    )
    assert m, out
    assert 0.45 < float(m.group(1)) < 0.55, headline  # Adam's state halved on 2 ranks
    assert "DDP + Adam: killed for memory on node1 (the engine's oom event)" in out
    assert "sharded: finished, parity holds" in out

    run_dir = tmp_path / run_id
    with open(run_dir / "memory.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["job"] for r in rows} == {"ddp-adam", "sharded", "torch-zero"}
    assert all(float(r["peak_rss_mib"]) > 0 and float(r["link_mb_per_step"]) > 0 for r in rows)
    doc = json.loads((run_dir / "memory.json").read_text())
    assert doc["limit"]["ddp_killed"] and doc["limit"]["sharded_fits"]
    assert doc["limit"]["ddp"]["oom_nodes"] == [1]
    assert (run_dir / "report.html").exists() and (run_dir / "summary.json").exists()
    for job in ("ddp-adam", "sharded", "torch-zero", "sharded-limited"):
        logs = load_run(run_dir / job / "logs")
        assert sorted(logs) == [0, 1] and all(log.end for log in logs.values()), job
    killed = load_run(run_dir / "ddp-adam-limited" / "logs")
    assert killed[1].end is None  # rank 1 was killed before its end record
