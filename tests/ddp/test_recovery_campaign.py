"""The fault campaign: its judge (``ddp.recovery.harness.audit``) on synthetic records, each rule
caught breaking (a split brain, a step committed twice, a step missing, ...) and a clean run
passing; its plan; then a short real campaign of local live jobs, one trial per fault kind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from ddp.program.records import EndRecord, FailureRecord
from ddp.recovery.harness.audit import (
    Expect,
    Process,
    commit_problems,
    digest_problems,
    judge_trial,
    recovery_times,
)
from ddp.recovery.harness.campaign import KINDS, main, percentile, plan
from ddp.recovery.records import (
    CommitRecord,
    DeciderRecord,
    HealRecord,
    QuorumRecord,
    RecoveryVerdictRecord,
)

T = 1000.0  # the fault's wall clock in the synthetic runs


def _commit(rank, step, q, world=3, t=None, digest=None, ok=True):
    t = T - 10 + step * 0.1 if t is None else t
    return CommitRecord(rank, step, q, world, ok, t, "", digest or f"w{step}" if ok else None)


def _quorum(rank, q, members, t):
    return QuorumRecord(rank, q, members, len(members), members.index(rank), t)


def _end(rank, steps, digest="final", judged=None):
    msg = "live recovery holds: ..."
    verdict = RecoveryVerdictRecord(
        rank, True, steps, steps, 0, 1, steps if judged is None else judged, msg
    )
    return [verdict, EndRecord(rank, True, digest)]


def _killed_run(steps=8, hit=4):
    """Three ranks; rank 2 SIGKILLed in step ``hit`` at T; 0 and 1 redo it in quorum 2."""
    procs = []
    for r in (0, 1, 2):
        recs = [_quorum(r, 1, [0, 1, 2], T - 10)]
        recs += [_commit(r, s, 1) for s in range(1, hit)]
        if r == 2:
            procs.append(Process("2", 2, recs, -signal.SIGKILL, killed=True))
            continue
        recs.append(_commit(r, hit, 1, t=T + 0.02, ok=False))
        recs.append(_quorum(r, 2, [0, 1], T + 0.03))
        recs += [
            _commit(r, s, 2, world=2, t=T + 0.08 + (s - hit) * 0.1) for s in range(hit, steps + 1)
        ]
        recs += _end(r, steps)
        procs.append(Process(str(r), r, recs, 0))
    return procs


def _survive(steps=8):
    return Expect("survive", steps, T)


def test_a_clean_run_is_clean_and_timed_from_the_fault():
    j = judge_trial(_killed_run(), _survive())
    assert j.problems == []
    assert j.outcome == "survived"
    assert j.quorum_s == pytest.approx(0.03) and j.commit_s == pytest.approx(0.08)


def test_a_commit_of_the_old_quorum_after_the_fault_is_not_the_recovery():
    procs = _killed_run()
    procs[0].records.insert(4, _commit(0, 4, 1, t=T + 0.01))  # the old quorum, after the fault
    assert recovery_times([r for p in procs for r in p.records], T)[1] == pytest.approx(0.08)


def test_a_split_brain_is_caught():
    procs = _killed_run()
    i = next(
        i for i, r in enumerate(procs[1].records) if isinstance(r, CommitRecord) and r.step == 6
    )
    procs[1].records[i] = _commit(1, 6, 2, world=2, digest="other weights")
    problems = digest_problems(procs)
    assert len(problems) == 1 and problems[0].startswith(
        "split brain at step 6: 2 parameter digests"
    )
    assert not judge_trial(procs, _survive()).clean


def test_records_without_digests_cannot_pass_for_no_split_brain():
    procs = _killed_run()
    for p in procs:
        for r in p.records:
            if isinstance(r, CommitRecord):
                r.params_sha256 = None
    assert digest_problems(procs) == [
        "the commit records carry no parameter digest: split brain cannot be judged"
    ]


def test_a_step_committed_twice_by_one_rank_is_caught():
    procs = _killed_run()
    procs[0].records.insert(3, _commit(0, 2, 1))  # step 2 again after step 2
    assert "rank 0 committed steps 2 twice" in commit_problems(procs, 8, ["0", "1"])


def test_a_step_committed_in_two_quorums_that_both_went_on_is_caught():
    procs = _killed_run()
    # Rank 2 was not dead after all: it committed step 4 in quorum 1 and went on alone.
    procs[2].records += [_commit(2, 4, 1, t=T + 0.01), _commit(2, 5, 1, t=T + 0.1)]
    problems = commit_problems(procs, 8, ["0", "1"])
    assert problems == [
        "step 4 committed twice: in quorum 1 by ranks 2, who went on from it, and in quorum 2 "
        "(ranks 0, 1)"
    ]


def test_a_step_redone_after_its_committer_died_is_not_twice():
    procs = _killed_run()
    procs[2].records.append(_commit(2, 4, 1, t=T + 0.01))  # committed, then died: redone by 0, 1
    assert commit_problems(procs, 8, ["0", "1"]) == []


def test_a_missing_step_is_caught():
    procs = _killed_run()
    procs[1].records = [
        r for r in procs[1].records if not (isinstance(r, CommitRecord) and r.step == 6)
    ]
    assert commit_problems(procs, 8, ["0", "1"]) == ["rank 1 skipped steps 6..6"]
    procs[0].records = [
        r for r in procs[0].records if not (isinstance(r, CommitRecord) and r.step == 8)
    ]
    assert "rank 0 ended at step 7 of 8" in commit_problems(procs, 8, ["0", "1"])


def test_a_heal_must_come_from_a_rank_at_that_step():
    procs = _killed_run()
    new = [HealRecord(2, 3, 6, 0, 1000, 0.01, T + 1, T + 0.5, T), _quorum(2, 3, [0, 1, 2], T + 0.9)]
    new += [_commit(2, s, 3) for s in (7, 8)] + _end(2, 8)
    procs.append(Process("2+", 2, new, 0))
    for p in procs[:2]:  # 0 and 1 enter quorum 3 at step 6 and commit 7 and 8 in it
        i = next(i for i, r in enumerate(p.records) if isinstance(r, CommitRecord) and r.step == 7)
        p.records.insert(i, _quorum(p.rank, 3, [0, 1, 2], T + 0.9))
        for r in p.records[i:]:
            if isinstance(r, CommitRecord):
                r.quorum_id = 3
    assert commit_problems(procs, 8, ["0", "1", "2+"]) == []
    new[0].step = 5  # the source was at 6: a step would be committed twice (or lost)
    problems = commit_problems(procs, 8, ["0", "1", "2+"])
    assert any(
        "healed to step 5 in quorum 3 from rank 0, which was at step 6" in p for p in problems
    )


def test_replicas_that_differ_at_the_end_or_a_verdict_that_broke_are_caught():
    procs = _killed_run()
    procs[1].records[-1] = EndRecord(1, True, "something else")
    assert any(
        p.startswith("replicas differ at the end") for p in judge_trial(procs, _survive()).problems
    )
    procs = _killed_run()
    procs[0].records[-2] = RecoveryVerdictRecord(0, False, 8, 8, 1, 2, 8, "live recovery broken: x")
    assert "rank 0's verdict: live recovery broken: x" in judge_trial(procs, _survive()).problems


def test_parity_never_judged_is_caught():
    procs = _killed_run()
    for p in procs[:2]:
        p.records[-2].judged_steps = 0
    assert (
        "parity against the single process was never judged"
        in judge_trial(procs, _survive()).problems
    )


def test_exits_must_match_the_fault():
    procs = _killed_run()
    procs[2].exit_code = 0  # the kill never landed
    procs[1].exit_code = 3
    procs[1].records.append(FailureRecord(1, "diagnosis: gone"))
    problems = judge_trial(procs, _survive()).problems
    assert "rank 2 was to die of the fault but exited 0" in problems
    assert "rank 1 exited 3: diagnosis: gone" in problems


def _coordinator_lost(code, line=None):
    """Three ranks, the coordinator killed at T in step 4; no quorum after it."""
    procs = []
    for r in (0, 1, 2):
        recs = [_quorum(r, 1, [0, 1, 2], T - 10)] + [
            _commit(r, s, 1) for s in range(1, 9 if code == 0 else 4)
        ]
        recs += _end(r, 8) if code == 0 else [FailureRecord(r, line)]
        procs.append(Process(str(r), r, recs, code, exit_t=T + 1.5))
    return procs


def test_a_run_that_lost_its_coordinator_and_says_holds_is_unclean():
    j = judge_trial(_coordinator_lost(0), Expect("either", 8, T, frozenset({3})))
    assert j.outcome == "stopped"
    assert j.problems[0] == "no quorum formed after the fault, yet ranks 0, 1, 2 said the run holds"


def test_a_decider_lost_is_replaced_or_the_trial_is_unclean():
    """Every rank trained to the end after the decider's loss: clean only if a member wrote
    that it took the role after the fault (a record from before it does not count)."""
    lost = Expect("survive", 8, T, decider_lost=True)
    procs = _coordinator_lost(0)
    assert judge_trial(procs, lost).problems == [
        "no member took the decider role after the decider was lost"
    ]
    procs[0].records.insert(0, DeciderRecord(0, 0, T - 20))  # at the start: not a take-over
    assert not judge_trial(procs, lost).clean
    procs[2].records.append(DeciderRecord(2, 1, T + 0.7))
    j = judge_trial(procs, lost)
    assert j.clean and j.role_s == pytest.approx(0.7), j.problems


def test_a_clean_stop_is_clean():
    line = "diagnosis: live recovery stopped: the coordinator is gone"
    j = judge_trial(_coordinator_lost(3, line), Expect("either", 8, T, frozenset({3})))
    assert (j.problems, j.outcome, j.stop_s) == ([], "stopped", pytest.approx(1.5))
    procs = _coordinator_lost(3, "first line\nsecond line")
    procs[0].exit_code = 4
    problems = judge_trial(procs, Expect("stop", 8, T)).problems
    assert "a clean stop exits 3 on every rank: rank 0 4, rank 1 3, rank 2 3" in problems
    assert "ranks 0, 1, 2 stopped with a diagnosis that is not one line" in problems


def test_the_plan_is_reproducible_and_covers_every_kind_and_rank():
    kinds = list(KINDS)
    a = plan(28, 5, kinds, 3, 40, 1.0)
    assert a == plan(28, 5, kinds, 3, 40, 1.0) and a != plan(28, 6, kinds, 3, 40, 1.0)
    for block in range(4):
        assert sorted(t.kind for t in a[7 * block : 7 * block + 7]) == sorted(kinds)
    kills = [t.victims[0] for t in a if t.kind == "kill"]
    assert sorted(kills[:3]) == [0, 1, 2]  # the lowest rank included
    for t in a:
        assert 2 <= t.step <= 37
        assert t.kind != "stop" or 1.2 <= t.stop_s <= 2.0


def test_percentile_is_nearest_rank():
    values = [0.5, 0.1, 0.3, 0.2, 0.4]
    assert [percentile(values, p) for p in (50, 90, 99)] == [0.3, 0.5, 0.5]
    assert percentile([0.7], 99) == 0.7


def _campaign(tmp_path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    # The default run (40 steps of at least 50 ms): a rank stopped early for twice the
    # heartbeat timeout still rejoins and heals well before the others finish.
    argv = [
        sys.executable,
        "-m",
        "ddp.recovery.harness.campaign",
        "--records",
        str(tmp_path),
        *args,
    ]
    p = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGTERM)  # the campaign stops its trial's processes
        out, _ = p.communicate(timeout=30)
        raise AssertionError(f"no end within {timeout} s:\n{out[-4000:]}") from None
    return subprocess.CompletedProcess(argv, p.returncode, out)


def test_a_short_campaign_of_every_fault_a_rank_can_suffer_is_clean(tmp_path):
    kinds = "kill,stop,two-kills,heal-kill,vote-kill,replacement-dies"
    r = _campaign(tmp_path, "--trials", "6", "--seed", "3", "--kinds", kinds, timeout=280)
    lines = r.stdout.splitlines()
    assert r.returncode == 0, r.stdout[-4000:]
    trials = [line for line in lines if line.startswith("trial ")]
    assert len(trials) == 6 and all(": clean" in line for line in trials), r.stdout
    assert lines[-1].startswith("campaign: 6 of 6 trials clean; ")


def test_losing_the_launchers_decider_is_survived(tmp_path):
    # The quorum stands without a decider; its state is in etcd, and a member takes the role.
    r = _campaign(tmp_path, "--trials", "1", "--seed", "3", "--kinds", "coordinator", timeout=200)
    assert r.returncode == 0, r.stdout[-4000:]
    assert "coordinator loss: SIGKILL of the coordinator" in r.stdout
    last = r.stdout.splitlines()[-1]
    assert re.search(r"coordinator loss -> decider role taken p50 [\d.]+ s, p99 [\d.]+ s$", last)
    assert ": clean, a member held the decider role " in r.stdout


@pytest.mark.parametrize(
    "args, said",
    [
        (["--kinds", "kill,meteor"], "--kinds: unknown meteor; one of kill, stop"),
        (["--trials", "0"], "--trials must be >= 1, got 0"),
        (["--world-size", "2"], "--world-size must be >= 3"),
        (["--steps", "10"], "--steps must be >= 20"),
        (["--model", "huge"], "model"),
    ],
)
def test_bad_input_is_refused_in_one_line_before_any_process(args, said, capsys):
    with pytest.raises(SystemExit) as e:
        main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and said in err[-1], err
