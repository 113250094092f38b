"""The launcher's decider lost, with real ranks on the job's own etcd: a member takes the
decider role through etcd and the job trains on, through a rank's death after it too (judged
from the ranks' typed records)."""

from __future__ import annotations

import re
import sys

import pytest

from ddp.program.records import EndRecord, load_attempts
from ddp.recovery.records import (
    CommitRecord,
    DeciderRecord,
    QuorumRecord,
    RecoveryVerdictRecord,
)
from tests.helpers import run_in_session


@pytest.mark.timeout(120)
def test_the_job_survives_its_deciders_sigkill_and_then_a_ranks(tmp_path):
    # On etcd: the launcher's decider dies in step 4 and the quorum stands (a member takes
    # the role from etcd's state); rank 0 dies in step 10, and whoever decides now forms the
    # quorum of ranks 1 and 2, which train on to the end.
    argv = [sys.executable, "-m", "ddp", "--recovery", "live", "--world-size", "3"]
    argv += ["--steps", "16", "--step-delay-ms", "20", "--log-dir", str(tmp_path / "logs")]
    argv += ["--kill-coordinator-at-step", "4", "--kill-rank", "0", "--kill-at-step", "10"]
    r = run_in_session(argv, 110)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    said = r.stdout + r.stderr
    assert re.search(r"\[rank\d\] \d\.1 holds the decider role", said), said[-3000:]
    logs = load_attempts(tmp_path / "logs")
    records = {rank: [x for log in runs for x in log.records] for rank, runs in logs.items()}
    took = [x for rs in records.values() for x in rs if isinstance(x, DeciderRecord)]
    assert took and took[0].quorum_id == 1, took  # a member took the role, in quorum 1
    ends = {rk: e.params_sha256 for rk, rs in records.items() for e in rs if type(e) is EndRecord}
    assert sorted(ends) == [1, 2] and len(set(ends.values())) == 1  # bitwise identical
    for rank in (1, 2):
        verdict = [v for v in records[rank] if isinstance(v, RecoveryVerdictRecord)][-1]
        assert verdict.holds and verdict.committed_steps == 16, verdict
        commits = [c.step for c in records[rank] if isinstance(c, CommitRecord) and c.committed]
        assert commits == list(range(1, 17))  # every step once, none lost
        quorums = [q for q in records[rank] if isinstance(q, QuorumRecord)]
        assert [q.members for q in quorums] == [[0, 1, 2], [1, 2]], quorums
    assert "coordinator SIGKILL -> noticed" in r.stdout
