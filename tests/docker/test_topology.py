"""Docker tier: ``python -m lab topology --quick`` end to end -- two containers of two ranks
each, a real delayed link between them (loopback within), real gloo ranks training the five
configurations -- its table's figures, its files, and nothing labelled ``lab.run`` left behind.
Run with ``pytest -m docker tests/docker/test_topology.py``."""

from __future__ import annotations

import csv
import json
import re

import pytest

from ddp.program.records import load_run
from lab.experiments.topology.plan import CONFIGURATIONS, QUICK
from tests.docker.lab_run import PNG, run_lab

pytestmark = pytest.mark.docker

_RATIO = r"\d+\.\d\dx"


@pytest.mark.timeout(1100)
def test_topology_quick_end_to_end(client, tmp_path):
    out, run_id = run_lab(client, ["topology", "--quick", "--runs-dir", str(tmp_path)], 1050)
    assert f"labelled lab.run={run_id}" in out
    # The link between the nodes was verified before anything trained.
    rtt = re.search(
        r"asked 5 ms one-way \(round trip \+10 ms\); measured round trip p50 "
        r"([\d.]+) ms",
        out,
    )
    assert rtt and 8.0 <= float(rtt.group(1)) <= 12.5, out
    assert len(re.findall(r"^\[ ?\d/5\] round 1 ", out, re.M)) == 5, out
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"step time vs torch DDP \(2 nodes x 2 ranks, 5 ms\): hierarchical {_RATIO}, "
        rf"hierarchical-fp16 {_RATIO}, auto cap {_RATIO}, flat {_RATIO}",
        last,
    ), last

    run_dir = tmp_path / run_id
    doc = json.loads((run_dir / "topology.json").read_text())
    rows = {r["config"]: r for r in doc["rows"]}
    assert list(rows) == [c.name for c in CONFIGURATIONS] and doc["headline"] == last
    assert all(r["parity"] for r in rows.values()), rows
    assert all(r["steps_measured"] == QUICK["steps"] - 3 for r in rows.values()), rows
    # Measured on the link: the two-level allreduce sends one node's sum across instead of a
    # ring's share per rank (about 2/3 here), and fp16 halves that again.
    cross = {name: r["cross_mb_per_step"] for name, r in rows.items()}
    assert cross["hierarchical"] < 0.8 * cross["flat"], cross
    assert cross["hierarchical-fp16"] < 0.6 * cross["hierarchical"], cross
    assert cross["torch"] == pytest.approx(cross["flat"], rel=0.1), cross
    assert (run_dir / "topology.png").read_bytes()[:8] == PNG
    assert (run_dir / "topology.txt").read_text().strip().splitlines()[-1] == last
    with open(run_dir / "topology.csv") as f:
        assert [r["config"] for r in csv.DictReader(f)] == list(rows)
    for conf in CONFIGURATIONS:  # every job: 4 ranks on 2 nodes, each with its config
        job = run_dir / f"{conf.name}-r1"
        logs = load_run(job / "logs")
        assert sorted(logs) == [0, 1, 2, 3] and all(log.end for log in logs.values()), job
        assert logs[0].config.config["wrapper"] == ("torch" if conf.name == "torch" else "ours")
        assert sorted(p.name for p in job.glob("eth0-node*.txt")) == [
            "eth0-node0.txt",
            "eth0-node1.txt",
        ]
