"""Docker tier: ``python -m lab run --recovery live`` on a user's own loop
(``examples/recovery_loop.py``, which uses ``ddp.recovery.api.Manager`` and is given no record
sink): three replicas in three containers on the lab's etcd, replica 1 docker-killed once it
committed step 5, a replacement with the same ``RANK`` started in its container and healed
from a peer. Checked from the records the Manager wrote by itself and from ``report.json``;
of the human text only the last line. Nothing labelled with the run is left behind.

Run with ``pytest -m docker tests/docker/test_run_live.py`` after the lab image was built from
this tree (``LAB_IMAGE`` picks the tag).
"""

from __future__ import annotations

import json
import re

import pytest

from ddp.program.records import load_attempts
from ddp.recovery.records import CommitRecord, HealRecord, QuorumRecord
from tests.docker.lab_run import run_lab

pytestmark = pytest.mark.docker
STEPS = 600  # at 40 ms each: time for the replacement (a container restart, torch) to join


@pytest.mark.timeout(900)
def test_a_manager_loop_survives_a_kill_and_heals_a_replacement(client, tmp_path):
    argv = [
        "run", "--recovery", "live", "--nodes", "3", "--fault", "kill:rank=1:at-step=6:rejoin",
        "--runs-dir", str(tmp_path), "--no-progress",
        "--", "python", "examples/recovery_loop.py", "--steps", str(STEPS), "--compute-ms", "40",
    ]  # fmt: skip
    out, run_id = run_lab(client, argv, 850)
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"run: live recovery, 3 replicas on 3 nodes; ranks 0, 2 committed every step "
        rf"1\.\.{STEPS} once each; the survivors went on at world 2 [\d.]+ s after the kill of "
        rf"rank 1 \(quorum \d+\); rank 1's replacement healed from rank [02] at step \d+ "
        rf"\([\d.]+ MB in [\d.]+ ms\) and committed steps \d+\.\.{STEPS}",
        last,
    ), out
    run_dir = tmp_path / run_id
    doc = json.loads((run_dir / "report.json").read_text())
    assert doc["ok"] and doc["headline"] == last and doc["last_step"] == STEPS
    assert [m["kind"] for m in doc["moments"]] == ["fault", "replacement"]

    logs = load_attempts(run_dir / "job" / "logs")  # the Manager's own records, no --records
    for rank in (0, 2):
        records = logs[rank][-1].records
        steps = [r.step for r in records if isinstance(r, CommitRecord) and r.committed]
        assert steps == list(range(1, STEPS + 1)), rank
        quorums = [r for r in records if isinstance(r, QuorumRecord)]
        assert any(q.members == [0, 2] for q in quorums)  # went on without rank 1
        assert quorums[-1].members == [0, 1, 2]  # and took the replacement back
    first, replacement = (a.records for a in logs[1])
    killed_at = max(r.step for r in first if isinstance(r, CommitRecord) and r.committed)
    assert 5 <= killed_at < STEPS
    heal = [r for r in replacement if isinstance(r, HealRecord)]
    assert len(heal) == 1 and heal[0].from_rank in (0, 2) and heal[0].nbytes > 0
    steps = [r.step for r in replacement if isinstance(r, CommitRecord) and r.committed]
    assert steps == list(range(heal[0].step + 1, STEPS + 1))
    assert doc["exit_codes"]["job"]["0"] == doc["exit_codes"]["job"]["2"] == 0
    assert doc["exit_codes"]["rejoin"]["1"] == 0
