"""Docker tier: real containers, real gloo ranks over a bridge network, real cleanup.

Run with ``pytest -m docker`` after ``python -m lab image --offline --base-image
lab-base:offline`` (or ``python -m lab image``). Skipped with a reason where no engine answers.
"""

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from lab.cluster import Cluster
from lab.engine import NodeFailed
from lab.specs import LABEL
from lab.topology import Topology, TrainSettings
from lab.watch import watch
from tests.helpers import leftovers

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[1]


def _lab(*args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "lab", *args], cwd=ROOT, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def _lab_up(client, tmp_path, *args):
    proc = _lab("up", "--no-progress", "--runs-dir", str(tmp_path), "--timeout", "400", *args)
    m = re.search(r"^run (\S+):", proc.stdout, re.M)
    assert m, proc.stdout + proc.stderr
    run_id = m.group(1)
    assert leftovers(client, f"{LABEL}={run_id}") == []
    return proc, tmp_path / run_id


def _assert_collected(run_dir, ranks, nodes):
    assert sorted(p.name for p in (run_dir / "logs").glob("rank*.jsonl")) == [
        f"rank{r}.jsonl" for r in range(ranks)
    ]
    assert sorted(p.name for p in run_dir.glob("node*.log")) == [
        f"node{i}.log" for i in range(nodes)
    ]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["exit_codes"] == {str(r): 0 for r in range(ranks)}
    assert summary["parity_holds"] is True
    assert _lab("parity", str(run_dir)).returncode == 0


@pytest.mark.timeout(600)
def test_lab_up_4x1_reaches_parity(client, tmp_path):
    proc, run_dir = _lab_up(client, tmp_path, "--steps", "10")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("parity holds: 4 replicas identical after all 10 steps"), last
    assert "[node0/rank0]" in proc.stdout  # rank 0's table, streamed with its prefix
    _assert_collected(run_dir, ranks=4, nodes=4)
    assert "node3.log" in {p.name for p in run_dir.iterdir()}


@pytest.mark.timeout(600)
def test_lab_up_2x2_topology_reaches_parity(client, tmp_path):
    topo = ROOT / "lab" / "topologies" / "2x2.yaml"
    proc, run_dir = _lab_up(client, tmp_path, "--topology", str(topo), "--steps", "10")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1].startswith("parity holds: 4 replicas")
    _assert_collected(run_dir, ranks=4, nodes=2)
    node1 = (run_dir / "node1.log").read_text()
    assert "[node1/rank2] exit 0" in node1 and "[node1/rank3] exit 0" in node1


@pytest.mark.timeout(600)
def test_lab_up_reports_broken_parity(client, tmp_path):
    # barrier instead of allreduce: the ranks never average gradients, so replicas drift.
    proc, run_dir = _lab_up(client, tmp_path, "--steps", "3", "--sync", "barrier")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1].startswith("parity broken:")
    assert _lab("parity", str(run_dir)).returncode == 1


@pytest.mark.timeout(300)
def test_a_killed_node_is_reported_and_everything_removed(client, tmp_path):
    topo = Topology(nodes=4, train=TrainSettings(steps=100_000, collective_timeout_s=60))
    with Cluster(client, topo) as cluster:
        label = f"{LABEL}={cluster.run_id}"
        nodes = cluster.start()
        cluster.go()

        def kill_node2_at_step_2(node, rank, text):
            if rank == 0 and text.split()[:1] == ["2"]:
                nodes[2].container.kill()

        with pytest.raises(NodeFailed, match="exited early") as err:
            watch(nodes, timeout_s=200, on_line=kill_node2_at_step_2, grace_s=5)
        assert "its last lines" in str(err.value)
        assert len(leftovers(client, label)) == 6  # still there until the cluster exits
    assert leftovers(client, label) == []


@pytest.mark.timeout(900)
def test_compose_up_reaches_parity(client):
    project = f"labtest-{secrets.token_hex(3)}"
    compose = ["docker", "compose", "-p", project, "-f", str(ROOT / "compose.yaml")]
    env = {**os.environ, "STEPS": "10"}
    try:
        up = subprocess.run([*compose, "up"], env=env, capture_output=True, text=True,
                            timeout=600)  # fmt: skip
        assert up.returncode == 0, up.stdout + up.stderr
        verdicts = [line for line in up.stdout.splitlines() if "node0" in line and "parity" in line]
        assert verdicts and "parity holds: 4 replicas identical after all 10 steps" in verdicts[-1]
        ps = subprocess.run([*compose, "ps", "-a", "--format", "json"], capture_output=True,
                            text=True, timeout=60, check=True)  # fmt: skip
        text = ps.stdout.strip()
        rows = (
            json.loads(text) if text.startswith("[") else [json.loads(x) for x in text.split("\n")]
        )
        codes = {row["Service"]: row["ExitCode"] for row in rows}
        assert codes == {"init": 0, "node0": 0, "node1": 0, "node2": 0, "node3": 0}, codes
    finally:
        subprocess.run([*compose, "down", "-v"], capture_output=True, timeout=120)
    assert leftovers(client, f"com.docker.compose.project={project}") == []
