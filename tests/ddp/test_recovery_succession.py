"""The coordinator's loss: with real ranks, a member takes over and the job trains on (judged
from the ranks' typed records); without a member that can take over, a member stops with
``CoordinatorLost`` (exit code 5) within the heartbeat timeout instead of training unguarded."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

import pytest

from ddp.program.records import EndRecord, load_attempts
from ddp.recovery.records import CommitRecord, QuorumRecord, RecoveryVerdictRecord
from tests.helpers import run_in_session

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


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


@pytest.mark.timeout(60)
def test_without_a_successor_a_member_stops_with_exit_code_5(tmp_path):
    """One member registered, no quorum yet (so no standby addresses in any quorum): the
    coordinator's death is noticed, and the member stops in one line instead of waiting."""
    from ddp.program.outcome import run_guarded
    from ddp.recovery.protocol.member import CoordinatorLost, Member
    from ddp.recovery.protocol.messages import SECRET_ENV

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    secret = "another-test-secret-0123456789"
    env = {**ENV, SECRET_ENV: secret}
    argv = [sys.executable, "-m", "ddp.recovery.protocol.coordinator", "--port", str(port)]
    coordinator = subprocess.Popen(
        [*argv, "--world-size", "2", "--timeout", "50"],
        env=env,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 40
        while True:  # until the coordinator listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and coordinator.poll() is None
                time.sleep(0.1)
        member = Member(f"127.0.0.1:{port}", 0, 2.0, 30.0, lambda *a: None, secret.encode())
        coordinator.kill()
        t0 = time.monotonic()
        with pytest.raises(CoordinatorLost) as e:
            member.next_quorum()
        assert time.monotonic() - t0 < 2.0  # within the heartbeat timeout
        assert "was lost: its process is gone" in str(e.value)
        assert run_guarded(0, None, member.next_quorum).code == 5
    finally:
        coordinator.kill()
        coordinator.wait(timeout=10)
