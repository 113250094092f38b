"""Docker tier: real containers, real gloo ranks over a bridge network, real cleanup.

Run with ``pytest -m docker`` after ``python -m lab image`` (``--offline --base-image IMAGE``
without a registry). Skipped with a reason where no engine answers.
"""

import json
import re

import docker.errors
import pytest

from ddp.program.config import TrainConfig
from lab.engine.cluster import Cluster
from lab.engine.events import RecordEvent
from lab.engine.layout import Layout
from lab.engine.specs import LABEL
from lab.experiments.up import TOPOLOGIES, failure_message
from tests.docker.lab_run import lab
from tests.helpers import leftovers

pytestmark = pytest.mark.docker


def _lab(*args):
    return lab(*args, timeout=600)


def _lab_up(client, tmp_path, *args):
    proc = _lab("up", "--no-progress", "--runs-dir", str(tmp_path), "--run-timeout", "400", *args)
    m = re.search(r"^run (\S+):", proc.stdout, re.M)
    assert m, proc.stdout + proc.stderr
    run_id = m.group(1)
    assert leftovers(client, f"{LABEL}={run_id}") == []
    return proc, tmp_path / run_id


def _assert_collected(run_dir, ranks, nodes):
    assert sorted(p.name for p in (run_dir / "train" / "logs").glob("rank*.jsonl")) == [
        f"rank{r}.jsonl" for r in range(ranks)
    ]
    assert sorted(p.name for p in (run_dir / "train").glob("node*.log")) == [
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
    assert "@ddp" not in proc.stdout  # records are followed, never shown as text
    assert re.search(r"^  node3 +3 +0 +\d", proc.stdout, re.M), proc.stdout  # exit 0, CPU s


@pytest.mark.timeout(600)
def test_lab_up_2x2_topology_reaches_parity(client, tmp_path):
    topo = TOPOLOGIES / "2x2.yaml"
    proc, run_dir = _lab_up(client, tmp_path, "--topology", str(topo), "--steps", "10")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1].startswith("parity holds: 4 replicas")
    _assert_collected(run_dir, ranks=4, nodes=2)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["layout"] == {"nodes": 2, "ranks_per_node": 2}
    assert all(summary["ranks"][str(r)]["cpu_s"] > 0 for r in range(4))


@pytest.mark.timeout(600)
def test_lab_up_reports_broken_parity(client, tmp_path):
    # barrier instead of allreduce: the ranks never average gradients, so replicas drift.
    proc, run_dir = _lab_up(client, tmp_path, "--steps", "3", "--sync", "barrier")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1].startswith("parity broken:")
    assert _lab("parity", str(run_dir)).returncode == 1


@pytest.mark.timeout(300)
def test_a_killed_node_is_reported_and_everything_removed(client, tmp_path):
    cfg = TrainConfig(steps=100_000, collective_timeout_s=60)
    with Cluster(client, Layout(4, 1), run_dir=tmp_path / "run") as cluster:
        label = f"{LABEL}={cluster.run_id}"

        def kill_node2_at_step_2(event):
            step = getattr(getattr(event, "record", None), "step", None)
            if isinstance(event, RecordEvent) and event.rank == 0 and step == 2:
                cluster.nodes[2].container.kill()

        job = cluster.train("train", cfg, 200, echo=kill_node2_at_step_2)
        running = job.wait(200, fail_grace_s=5)
        assert job.codes[2] == 137, job.codes  # died with its container: SIGKILL
        message = failure_message(job)
        assert "exited early with code" in message and "its last lines" in message
        assert running or any(c == 3 for c in job.codes.values())  # survivors noticed or wait
        assert len(leftovers(client, label)) == 6  # still there until the cluster exits
    assert leftovers(client, label) == []
    assert (tmp_path / "run" / "train" / "logs" / "rank0.jsonl").exists()  # collected on exit


@pytest.mark.timeout(120)
def test_a_failed_start_removes_what_it_created(client):
    """Node 1 asks for more CPUs than the host has: the engine refuses it after the network,
    the volume and node 0 exist; they must be gone when the error reaches the caller."""
    cluster = Cluster(client, Layout(2, 1), cpus={1: 1000.0})
    with pytest.raises(docker.errors.APIError), cluster:
        pass
    assert leftovers(client, f"{LABEL}={cluster.run_id}") == []
