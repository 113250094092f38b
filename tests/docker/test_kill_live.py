"""Docker tier: ``python -m lab kill --recovery live --mode kill --rejoin`` end to end -- the
job's etcd in three containers, the launcher's decider in one, four ranks in four containers,
one SIGKILLed by ``docker kill`` during a step, the survivors going on at world 3, a
replacement started in the dead rank's container and healed from a peer, then the restart
path on the same job -- its timeline, its table, its verdict line, its files, and nothing
labelled ``lab.run`` left behind; and the control plane as the target: the decider, one etcd
member (survived), two (a clean stop).
Run with ``pytest -m docker tests/docker/test_kill_live.py``."""

from __future__ import annotations

import json
import re

import pytest

from ddp.program.records import load_attempts
from ddp.recovery.records import CommitRecord, HealRecord, RecoveryVerdictRecord
from tests.docker.lab_run import run_lab

pytestmark = pytest.mark.docker


@pytest.mark.timeout(1500)
def test_live_recovery_with_a_replacement_and_the_restart_path(client, tmp_path):
    # 50 steps: the replacement's container, interpreter and torch take 3-7 s to register on
    # a loaded host, and must join before the survivors' last step (30 steps ended first).
    argv = "kill --recovery live --mode kill --rank 2 --at-step 4 --rejoin --steps 50"
    out, run_id = run_lab(client, [*argv.split(), "--runs-dir", str(tmp_path)], 1450)
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(
        r"live recovery: [\d.]+ s from the fault to the first committed step at world 3 "
        r"\(restart path: [\d.]+ s\); rank 2 healed from rank \d in [\d.]+ s; replicas "
        r"identical after every committed step",
        last,
    ), out
    assert "lab: kill rank 2 (docker kill" in out and "lab: replacement for rank 2 started" in out
    assert re.search(r"quorum \d+ formed: ranks 0, 1, 3 \(world 3; lost rank 2\)", out), out
    assert re.search(r"^restart \(kill --recover\) +[\d.]+ s", out, re.M), out
    assert re.search(r"^ours \(live\) +[\d.]+ s +[\d.]+ s +\d+", out, re.M), out

    doc = json.loads((tmp_path / run_id / "live.json").read_text())
    assert doc["ok"] and doc["headline"] == last and doc["figures"]["heal_from"] in (0, 1, 3)
    live, restart = doc["paths"][1], doc["paths"][0]
    # Noticing and going on without a restart beats restarting every container and resuming.
    assert live["fault_to_commit_s"] < restart["fault_to_commit_s"], doc["paths"]
    # Every survivor and the replacement committed all 50 steps and ended with one verdict.
    logs = load_attempts(tmp_path / run_id / "live" / "logs")
    replacement = load_attempts(tmp_path / run_id / "rejoin" / "logs")[2][-1].records
    for records in [*(logs[r][-1].records for r in (0, 1, 3)), replacement]:
        verdict = [r for r in records if isinstance(r, RecoveryVerdictRecord)]
        assert len(verdict) == 1 and verdict[0].holds, verdict
        assert verdict[0].committed_steps == verdict[0].expected_steps == 50
    heal = [r for r in replacement if isinstance(r, HealRecord)]
    assert heal and heal[0].nbytes > 2_000_000  # the tower's weights and momentum
    commits = [r for r in replacement if isinstance(r, CommitRecord) and r.committed]
    assert commits and commits[0].world_size == 4 and commits[-1].step == 50


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("target", "lost"),
    [
        ("--target coordinator", "the launcher's decider"),
        ("--target etcd", "1 of the 3 etcd members"),
    ],
)
def test_the_control_plane_lost_and_survived(client, tmp_path, target, lost):
    """The decider's container, or one etcd member's, SIGKILLed in step 4: by design the job
    trains to the end (a member takes the decider's role; etcd answers while two of three
    live), every step committed once and the replicas identical."""
    argv = f"kill --recovery live {target} --mode kill --at-step 4 --steps 30"
    out, run_id = run_lab(client, [*argv.split(), "--runs-dir", str(tmp_path)], 850)
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"{lost} lost in step 4: the job survived the loss of {lost}"), out
    assert f"lab: kill {lost} (docker kill" in out
    if target == "--target coordinator":  # survived because a member decides now
        assert re.search(r"rank \d took the decider role [\d.]+ s after it", last), out
    doc = json.loads((tmp_path / run_id / "live.json").read_text())
    assert doc["ok"] and doc["headline"] == last and doc["paths"][0]["name"] == "ours (live)"
    logs = load_attempts(tmp_path / run_id / "live" / "logs")
    assert sorted(logs) == [0, 1, 2, 3]
    for attempts in logs.values():
        verdict = [r for r in attempts[-1].records if isinstance(r, RecoveryVerdictRecord)]
        assert len(verdict) == 1 and verdict[0].holds, verdict
        assert verdict[0].committed_steps == verdict[0].expected_steps == 30


@pytest.mark.timeout(900)
def test_etcds_majority_lost_is_a_clean_stop(client, tmp_path):
    """Two of etcd's three members SIGKILLed in step 4: nothing can decide a quorum any more,
    so every rank stops with ddp's exit code for it (one diagnosis line each) and none says
    its replicas held."""
    argv = "kill --recovery live --target etcd --count 2 --mode kill --at-step 4 --steps 30"
    out, run_id = run_lab(client, [*argv.split(), "--runs-dir", str(tmp_path)], 850)
    last = out.strip().splitlines()[-1]
    assert last.startswith(
        "2 of the 3 etcd members lost in step 4: clean stop: every rank noticed the loss"
    ), out
    doc = json.loads((tmp_path / run_id / "live.json").read_text())
    assert doc["ok"] and doc["headline"] == last
    logs = load_attempts(tmp_path / run_id / "live" / "logs")
    assert sorted(logs) == [0, 1, 2, 3]
    for attempts in logs.values():
        records = attempts[-1].records
        assert not any(isinstance(r, RecoveryVerdictRecord) and r.holds for r in records)
        assert attempts[-1].failure is not None and "etcd" in attempts[-1].failure.message
