"""Live recovery with real ranks on this host: ``python -m ddp --recovery live`` starts a
coordinator and 4 ``python -m ddp train`` processes; one is SIGKILLed mid-run (the survivors go
on at 3 and end bitwise identical), killed and replaced (the replacement heals from a peer and
ends identical), or SIGSTOPped (its missing heartbeats drop it). Judged from the typed records
the ranks wrote, not from the printed text."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ddp.program.records import EndRecord, load_attempts
from ddp.recovery.records import (
    CommitRecord,
    FaultRecord,
    HealRecord,
    QuorumRecord,
    RecoveryVerdictRecord,
)
from tests.helpers import run_in_session


def _live(tmp_path: Path, *args: str, timeout: float = 50) -> subprocess.CompletedProcess:
    argv = ["--recovery", "live", "--world-size", "4", "--log-dir", str(tmp_path / "logs")]
    cmd = [sys.executable, "-m", "ddp", *argv, "--collective-timeout", "60", *args]
    r = run_in_session(cmd, timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def _records(tmp_path: Path) -> dict[int, list]:
    """Every rank's records, all attempts (a replacement's file follows the killed one's)."""
    return {
        rank: [rec for log in logs for rec in log.records]
        for rank, logs in load_attempts(tmp_path / "logs").items()
    }


def _ends(records: dict[int, list]) -> dict[int, str]:
    return {
        r: e.params_sha256 for r, recs in records.items() for e in recs if isinstance(e, EndRecord)
    }


def _verdicts_hold(records: dict[int, list], ranks: list[int]) -> None:
    for r in ranks:
        verdict = [v for v in records[r] if isinstance(v, RecoveryVerdictRecord)]
        assert verdict and verdict[-1].holds, verdict
        assert verdict[-1].committed_steps == verdict[-1].expected_steps


@pytest.mark.timeout(60)
def test_sigkill_of_one_of_four_survivors_go_on_at_three(tmp_path):
    r = _live(
        tmp_path,
        "--steps",
        "12",
        "--step-delay-ms",
        "20",
        "--kill-rank",
        "2",
        "--kill-at-step",
        "5",
    )
    records = _records(tmp_path)
    ends = _ends(records)
    assert sorted(ends) == [0, 1, 3] and len(set(ends.values())) == 1  # bitwise identical
    _verdicts_hold(records, [0, 1, 3])
    for rank in (0, 1, 3):
        worlds = [q.world_size for q in records[rank] if isinstance(q, QuorumRecord)]
        assert worlds == [4, 3], worlds
        assert any(isinstance(f, FaultRecord) for f in records[rank])
        commits = [c for c in records[rank] if isinstance(c, CommitRecord) and c.committed]
        assert [c.step for c in commits] == list(range(1, 13))  # each step once, none lost
        assert {c.world_size for c in commits if c.step > 5} == {3}
    assert "committed at world 3" in r.stdout and "live recovery holds" in r.stdout


@pytest.mark.timeout(130)
def test_a_replacement_heals_from_a_peer_bitwise(tmp_path):
    # 300 steps of 40 ms: time for the replacement's interpreter and torch to start on a
    # loaded host (it must join before the end).
    _live(
        tmp_path,
        "--steps",
        "300",
        "--step-delay-ms",
        "40",
        "--kill-rank",
        "1",
        "--kill-at-step",
        "3",
        "--rejoin",
        timeout=120,
    )
    records = _records(tmp_path)
    ends = _ends(records)
    assert sorted(ends) == [0, 1, 2, 3] and len(set(ends.values())) == 1
    _verdicts_hold(records, [0, 1, 2, 3])
    heals = [h for h in records[1] if isinstance(h, HealRecord)]
    assert len(heals) == 1 and heals[0].from_rank in (0, 2, 3) and heals[0].nbytes > 0
    worlds = [q.world_size for q in records[0] if isinstance(q, QuorumRecord)]
    assert worlds == [4, 3, 4], worlds


@pytest.mark.timeout(60)
def test_a_stalled_rank_is_dropped_by_its_missing_heartbeats(tmp_path):
    r = _live(
        tmp_path,
        "--steps",
        "40",
        "--step-delay-ms",
        "20",
        "--kill-rank",
        "3",
        "--kill-at-step",
        "4",
        "--signal",
        "STOP",
        "--heartbeat-timeout",
        "1",
    )
    records = _records(tmp_path)
    ends = _ends(records)
    assert sorted(ends) == [0, 1, 2] and len(set(ends.values())) == 1
    _verdicts_hold(records, [0, 1, 2])
    faults = [f for f in records[0] if isinstance(f, FaultRecord)]
    assert faults[0].source == "coordinator" and "missed heartbeats for 1 s" in faults[0].why
    assert "rank 3 sent SIGSTOP in step 4" in r.stdout


@pytest.mark.timeout(60)
def test_a_reused_log_dir_judges_this_run_alone(tmp_path):
    """An earlier run's files stay in a reused ``--log-dir`` (this run's are the next
    attempts): its end record, with other parameters, must not count. Before, the report read
    every file there, and said the replicas differed (or counted 8 replicas for 4)."""
    from ddp.record import RecordLog

    earlier = RecordLog(str(tmp_path / "logs"), 0)
    earlier.write(EndRecord(0, True, "0" * 64))
    earlier.close()
    r = _live(tmp_path, "--steps", "3", "--no-reference")
    assert "4 replicas bitwise identical at the end" in r.stdout, r.stdout[-2000:]
