"""Docker tier: torchrun in containers. One torchrun per node, ranks assigned by its c10d
rendezvous on node 0 over the run's network (no --rank, no shared rendezvous file), parity
judged from rank 0 wherever it landed, and everything removed afterwards."""

import json

import pytest

from tests.docker.test_up import _lab_up

pytestmark = pytest.mark.docker


@pytest.mark.timeout(600)
@pytest.mark.parametrize("nodes, procs", [(4, 1), (2, 2)], ids=["4x1", "2x2"])
def test_lab_up_under_torchrun_reaches_parity(client, tmp_path, nodes, procs):
    proc, run_dir = _lab_up(
        client,
        tmp_path,
        "--launcher",
        "torchrun",
        "--nodes",
        str(nodes),
        "--procs-per-node",
        str(procs),
        "--steps",
        "6",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("parity holds: 4 replicas identical after all 6 steps"), last
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["launcher"] == "torchrun"
    assert summary["exit_codes"] == {str(n): 0 for n in range(nodes)}  # per node: torchrun's
    placed = summary["placement"]
    assert sorted(r for ranks in placed.values() for r in ranks) == [0, 1, 2, 3]
    assert all(len(ranks) == procs for ranks in placed.values()), placed
    logs = sorted(p.name for p in (run_dir / "train" / "logs").glob("rank*.jsonl"))
    assert logs == [f"rank{r}.jsonl" for r in range(4)]
    assert sorted(p.name for p in (run_dir / "train").glob("node*.log")) == [
        f"node{i}.log" for i in range(nodes)
    ]
