"""Docker tier: ``python -m lab topology`` end to end -- containers of one or two ranks each, a
real delayed link between them (loopback within), real gloo ranks training every
configuration, the limit on the bare link -- at two layouts in one command, and with the link
changed during the jobs: the tables' figures, the files, and nothing labelled ``lab.run`` left
behind. Run with ``pytest -m docker tests/docker/test_topology.py``."""

from __future__ import annotations

import csv
import json
import re

import pytest

from ddp.program.records import load_run
from lab.engine.layout import Layout
from lab.experiments.topology import QUICK, TopologyPlan
from tests.docker.lab_run import PNG, run_lab

pytestmark = pytest.mark.docker

_RATIO = r"\d+\.\d\dx"


@pytest.mark.timeout(1500)
def test_topology_quick_at_two_layouts(client, tmp_path):
    argv = ["topology", "--quick", "--layouts", "2x2,2x1", "--runs-dir", str(tmp_path)]
    out, run_id = run_lab(client, argv, 1450)
    assert f"labelled lab.run={run_id}" in out
    # The link between the nodes was verified before anything but the limit trained, once
    # per layout (each its own cluster).
    rtts = re.findall(
        r"asked 5 ms one-way \(round trip \+10 ms\); measured round trip p50 ([\d.]+) ms", out
    )
    assert len(rtts) == 2 and all(8.0 <= float(x) <= 12.5 for x in rtts), out
    assert out.count("link cleared: the limit runs on the bare link") == 0  # first, bare
    plan = TopologyPlan(layouts=(Layout(2, 2), Layout(2, 1)), rounds=1)
    assert len(re.findall(r"^\[ ?\d+/\d+\] 2x[12] round 1 ", out, re.M)) == plan.total, out
    lines = out.strip().splitlines()
    assert re.fullmatch(
        rf"step time vs torch DDP \(2 nodes x 2 ranks, 5 ms\): (comm auto {_RATIO}, )?"
        rf"hierarchical {_RATIO}, hierarchical-fp16 {_RATIO}, flat {_RATIO}; vs the limit: "
        rf"torch DDP {_RATIO}.*",
        lines[-2],
    ), lines[-2]
    assert lines[-1].startswith("step time vs torch DDP (2 nodes x 1 rank, 5 ms): ")
    assert "hierarchical" not in lines[-1]  # one rank per node: the flat ring, left out
    assert any(line.startswith("note: every rank of every layout shares") for line in lines)

    run_dir = tmp_path / run_id
    doc = json.loads((run_dir / "topology.json").read_text())
    assert doc["headlines"] == lines[-2:]
    rows = {(r["layout"], r["config"]): r for r in doc["rows"]}
    assert [c.name for c in plan.configurations(Layout(2, 2))] == [
        c for lay, c in rows if lay == "2x2"
    ]
    assert all(r["parity"] for r in rows.values()), rows
    assert all(r["steps_measured"] == QUICK["steps"] - 3 for r in rows.values()), rows
    # Every row's network cost is measured from the limit of its own layout (no timing is
    # asserted: the shared host's load moves them).
    for (lay, _conf), row in rows.items():
        limit = rows[lay, "limit"]["median_step_ms"]
        assert row["network_ms"] == pytest.approx(row["median_step_ms"] - limit), row
        assert row["step_time_vs_limit"] == pytest.approx(row["median_step_ms"] / limit), row
    # Measured on the link: two levels send one node's sum across, fp16 halves that again.
    cross = {c: rows["2x2", c]["cross_mb_per_step"] for c in ("flat", "hierarchical")}
    cross["fp16"] = rows["2x2", "hierarchical-fp16"]["cross_mb_per_step"]
    assert (
        cross["hierarchical"] < 0.8 * cross["flat"] and cross["fp16"] < 0.6 * cross["hierarchical"]
    ), cross
    assert (run_dir / "topology.png").read_bytes()[:8] == PNG
    assert (run_dir / "topology.txt").read_text().strip().splitlines()[-1] == lines[-1]
    with open(run_dir / "topology.csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    for lay, conf in rows:  # every job: its ranks on their nodes, each with its config
        job = run_dir / f"{lay}-{conf}-r1"
        logs = load_run(job / "logs")
        world = Layout(2, int(lay[-1])).world_size
        assert sorted(logs) == list(range(world)) and all(log.end for log in logs.values())
        wrapper = "torch" if conf in ("torch", "limit") else "ours"
        assert logs[0].config.config["wrapper"] == wrapper
        assert sorted(p.name for p in job.glob("eth0-node*.txt")) == [
            "eth0-node0.txt",
            "eth0-node1.txt",
        ]


@pytest.mark.timeout(1200)
def test_topology_link_change_mid_run(client, tmp_path):
    """2 nodes x 1 rank at 5 ms and 20 Mbit/s (steps of about a second), changed to 20 ms
    without a cap at step 6 of 16: the lab re-shapes the link from rank 0's records, the probe
    measures it during the job and in full once idle after it, and the table has the steps
    around the change."""
    argv = ["topology", "--quick", "--layouts", "2x1", "--rate-mbit", "20", "--steps", "16"]
    argv += ["--change-at-step", "6", "--to-ms", "20", "--runs-dir", str(tmp_path)]
    out, run_id = run_lab(client, argv, 1150)
    rows_changed = len(TopologyPlan(layouts=(Layout(2, 1),)).configurations()) - 1
    changed = re.findall(r"link changed to 20 ms at step 6 \(([\d.]+) s to re-shape", out)
    assert len(changed) == rows_changed, out
    idle = re.findall(
        r"idle after the job: shaper \w+: asked 20 ms one-way \(round trip \+40 ms\); "
        r"measured round trip p50 ([\d.]+) ms",
        out,
    )
    assert len(idle) == rows_changed and all(32.0 <= float(x) <= 48.0 for x in idle), out
    assert "before ms" in out and "recover" in out
    doc = json.loads((tmp_path / run_id / "topology.json").read_text())
    rows = {r["config"]: r for r in doc["rows"]}
    assert rows["limit"]["steps_to_recover"] == []  # its link stays bare
    assert all(len(rows[c]["steps_to_recover"]) == 1 for c in rows if c != "limit"), rows
    jobs = [j for j in doc["jobs"] if j["change"] is not None]
    assert len(jobs) == rows_changed
    for j in jobs:
        assert j["change"]["applied_t"] > j["change"]["seen_t"] > 0, j
        effective = j["recovery"]["effective_step"]
        assert effective is None or effective > 6, j
