"""Docker tier: ``python -m lab memory --quick`` end to end -- real containers, real gloo
ranks, a real memory limit -- DDP with Adam, ours sharded and torch's ZeRO measured at 4 ranks,
then the limited jobs under the limit the lab chose from those peaks: DDP with Adam killed by
the kernel for memory and named so from the engine's oom event, the sharded run finishing with
parity; its table, files and headline, and nothing labelled ``lab.run`` left behind. Run with
``pytest -m docker tests/docker/test_memory.py``."""

from __future__ import annotations

import csv
import json
import re

import pytest

from ddp.program.records import load_run
from lab.engine.specs import LABEL
from tests.docker.lab_run import lab
from tests.helpers import leftovers

pytestmark = pytest.mark.docker


@pytest.mark.timeout(1500)
def test_memory_quick_end_to_end(client, tmp_path):
    argv = "memory --quick --no-progress --run-timeout 400"
    proc = lab(*argv.split(), "--runs-dir", str(tmp_path), timeout=1450)
    out = proc.stdout
    run_id = re.search(r"^run (\S+):", out, re.M).group(1)
    assert leftovers(client, f"{LABEL}={run_id}") == []
    headline = out.strip().splitlines()[-1]
    m = re.fullmatch(
        r"sharded optimizer at 4 ranks: optimizer state ([\d.]+)x per rank \(torch ZeRO: "
        r"([\d.]+)x\), link bytes ([\d.]+)x DDP \(torch ZeRO: ([\d.]+)x\), step time "
        r"([\d.]+)x DDP \(torch ZeRO: ([\d.]+)x\); fits in ([\d-]+) MiB where DDP\+Adam was "
        r"killed",
        headline,
    )
    assert m and proc.returncode == 0, f"stdout:\n{out}\nstderr:\n{proc.stderr}"
    assert 0.24 < float(m.group(1)) < 0.26, headline  # Adam's state cut in 4
    assert 0.95 < float(m.group(3)) < 1.05, headline  # reduce-scatter + all-gather = allreduce
    assert float(m.group(4)) > 1.2, headline  # torch's ZeRO broadcasts after its allreduce
    assert "DDP + Adam: killed for memory on node1, node2, node3 (the engine's oom event)" in out
    assert "sharded: finished, parity holds" in out

    run_dir = tmp_path / run_id
    with open(run_dir / "memory.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["job"] for r in rows} == {"ddp-adam", "sharded", "torch-zero"}
    assert all(float(r["peak_rss_mib"]) > 0 and float(r["link_mb_per_step"]) > 0 for r in rows)
    doc = json.loads((run_dir / "memory.json").read_text())
    assert doc["limit"]["ddp_killed"] and doc["limit"]["ddp"]["oom_nodes"] == [1, 2, 3]
    assert sorted(doc["limit"]["mib"]) == ["1", "2", "3"]  # node0 (the reference) unlimited
    assert (run_dir / "report.html").exists() and (run_dir / "summary.json").exists()
    for job in ("ddp-adam", "sharded", "torch-zero"):
        logs = load_run(run_dir / job / "logs")
        assert sorted(logs) == [0, 1, 2, 3] and all(log.end for log in logs.values()), job
    killed = load_run(run_dir / "ddp-adam-limited" / "logs")
    assert killed[1].end is None  # rank 1 was killed before its end record
