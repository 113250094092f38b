"""``lab run --recovery live``, Docker-free: its refusals (one line each), the replicas'
commands, the kill's cue from the Manager's commit records, and the analysis and report of a
run built from synthetic records (a kill of rank 1 in step 6, a replacement healed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddp.recovery.records import CommitRecord, FaultRecord, HealRecord, QuorumRecord
from lab.engine.events import RecordEvent
from lab.experiments.run import live
from lab.experiments.run.faults import parse_fault
from lab.experiments.run.run import RunPlan
from tests.helpers import cli_error


def _plan(tmp_path: Path, *faults: str, **kw) -> RunPlan:
    (tmp_path / "train.py").write_text("print('hi')\n")
    kw.setdefault("nodes", 3)
    kw.setdefault("recovery", "live")
    return RunPlan(
        ("python", "train.py", "--steps", "10"),
        workdir=tmp_path,
        faults=tuple(parse_fault(f) for f in faults),
        runs_dir=tmp_path / "runs",
        **kw,
    )


def test_rejoin_is_a_kill_s_mark() -> None:
    cue = parse_fault("kill:rank=1:at-step=6:rejoin")
    assert (cue.rank, cue.at_step, cue.rejoin) == (1, 6, True)
    assert cue.describe() == "SIGKILL rank 1 in step 6, then a replacement joins"
    assert not parse_fault("kill:rank=1:at-step=6").rejoin
    with pytest.raises(ValueError, match="'rejoin' is not KEY=VALUE"):
        parse_fault("pause:node=1:at=5:rejoin")


@pytest.mark.parametrize(
    ("kw", "faults", "said"),
    [
        ({"ranks_per_node": 2}, (), "one replica per node: drop --ranks-per-node 2"),
        ({"nodes": 2}, (), "--recovery live needs --nodes >= 3, got 2"),
        ({"ms": 5.0}, (), "runs on the bare link: drop --ms"),
        ({"hang_after_s": 9.0}, (), "drop --hang-after"),
        ({}, ("pause:node=1:at=5",), "takes kill:rank=R:at-step=N[:rejoin] (or at=SECONDS), not"),
        ({}, ("kill:rank=1:at-step=1",), "at-step must be >= 2"),
        ({}, ("kill:rank=1:at-step=3", "kill:rank=2:at-step=5"), "takes one --fault"),
        ({}, ("kill:rank=3:at-step=3",), "rank 3 is out of range, the ranks are 0..2"),
        ({"recovery": "elastic"}, (), "--recovery must be one of torchrun, live"),
    ],
)
def test_what_live_recovery_refuses(tmp_path, kw, faults, said) -> None:
    with pytest.raises(ValueError) as e:
        _plan(tmp_path, *faults, **kw)
    assert said in str(e.value)
    assert "\n" not in str(e.value)


def test_rejoin_under_torchrun_is_refused(tmp_path) -> None:
    (tmp_path / "train.py").write_text("")
    with pytest.raises(ValueError, match="rejoin needs --recovery live"):
        RunPlan(("train.py",), workdir=tmp_path, faults=(parse_fault("kill:rank=0:at=3:rejoin"),))


def test_the_command_line_refuses_in_one_line(tmp_path, capsys) -> None:
    (tmp_path / "train.py").write_text("")
    argv = f"run --recovery live --nodes 3 --ranks-per-node 2 --workdir {tmp_path} -- train.py"
    said = cli_error(argv.split(), capsys).strip().splitlines()[-1]
    assert said.endswith("drop --ranks-per-node 2 (use --nodes for more replicas)"), said


def test_each_replica_runs_the_command_as_its_rank(tmp_path) -> None:
    argvs = live.replica_argvs(_plan(tmp_path))
    assert sorted(argvs) == [0, 1, 2]
    assert argvs[2][:2] == ["env", "RANK=2"]
    assert argvs[2][-4:] == ["python", "train.py", "--steps", "10"]
    assert live.replica_argvs(_plan(tmp_path), [1]).keys() == {1}


def test_the_kill_is_cued_by_the_replica_s_commit_of_the_step_before(tmp_path) -> None:
    cue = parse_fault("kill:rank=1:at-step=6")

    def event(rank: int, step: int, committed: bool = True) -> RecordEvent:
        return RecordEvent(0.0, rank, rank, CommitRecord(rank, step, 1, 3, committed, 1.0))

    assert not live.cue_due(cue, event(1, 4), 0.0, 0.0)
    assert not live.cue_due(cue, event(0, 5), 0.0, 0.0)  # another replica's
    assert not live.cue_due(cue, event(1, 5, committed=False), 0.0, 0.0)
    assert live.cue_due(cue, event(1, 5), 0.0, 0.0)
    timed = parse_fault("kill:rank=1:at=3s")
    assert not live.cue_due(timed, None, 102.0, 100.0)
    assert live.cue_due(timed, None, 103.5, 100.0)


def _commits(rank: int, steps: range, q: int, world: int, t0: float) -> list:
    return [CommitRecord(rank, s, q, world, True, t0 + 0.1 * i) for i, s in enumerate(steps)]


def _result(tmp_path: Path, *, heal: bool = True, drop: int | None = None) -> live.LiveRunResult:
    plan = _plan(tmp_path, "kill:rank=1:at-step=6:rejoin")
    q1 = [QuorumRecord(r, 1, [0, 1, 2], 3, r, 100.0, "first") for r in (0, 1, 2)]
    survivors = {}
    for r in (0, 2):
        recs = [q1[r], *_commits(r, range(1, 6), 1, 3, 100.1)]
        recs += [
            FaultRecord(r, 1, 6, 100.7, "self", "connection closed"),
            CommitRecord(r, 6, 1, 3, False, 100.7),
            QuorumRecord(r, 2, [0, 2], 2, r // 2, 100.8, "lost rank 1", [1]),
            *_commits(r, range(6, 9), 2, 2, 100.9),
            QuorumRecord(r, 3, [0, 1, 2], 3, r, 102.0, "rank 1 joined", [], [1]),
            *_commits(r, range(9, 11), 3, 3, 102.1),
        ]
        survivors[r] = [[c for c in recs if not (isinstance(c, CommitRecord) and c.step == drop)]]
    first = [q1[1], *_commits(1, range(1, 6), 1, 3, 100.1)]
    second = [QuorumRecord(1, 3, [0, 1, 2], 3, 1, 102.0, "rank 1 joined", [], [1])]
    if heal:
        second.append(HealRecord(1, 3, 8, 0, 5000, 0.01, 102.0, 101.8, 101.3))
    second += _commits(1, range(9, 11), 3, 3, 102.1)
    return live.LiveRunResult(
        plan,
        "run-x",
        tmp_path / "runs" / "run-x",
        started=99.0,
        seconds=30.0,
        moments=[
            live.Moment(100.6, "lab: kill rank 1 in step 6 (docker kill)", "fault"),
            live.Moment(101.2, "lab: replacement for rank 1 started (RANK=1)", "replacement"),
        ],
        records={0: survivors[0], 1: [first, second], 2: survivors[2]},
        codes={"job": {0: 0, 1: 137, 2: 0}, "rejoin": {1: 0}, "decider": {3: 0}},
    )


def test_a_kill_survived_and_a_replacement_healed(tmp_path) -> None:
    summary = live.analyse(_result(tmp_path))
    assert summary.ok, summary.failed
    assert summary.last_step == 10
    assert summary.held[0] == "ranks 0, 2 committed every step 1..10 once each"
    assert "went on at world 2 0.30 s after the kill of rank 1 (quorum 2)" in summary.held[1]
    assert summary.held[2].startswith("rank 1's replacement healed from rank 0 at step 8")
    text = live.lines(summary)
    body = "\n".join(text)
    for said in (
        "lab: kill rank 1 in step 6",
        "rank 0 noticed quorum 1 fail at step 6",
        "quorum 2 formed: ranks 0, 2 (world 2; lost rank 1)",
        "lab: replacement for rank 1 started",
        "rank 1 healed from rank 0: step 8",
        "quorum 3 formed: ranks 0, 1, 2 (world 3; rank 1 joined)",
    ):
        assert said in body, body
    assert text[-1].startswith("run: live recovery, 3 replicas on 3 nodes; ranks 0, 2 committed")


def test_a_lost_step_and_a_replacement_that_did_not_heal_fail(tmp_path) -> None:
    gap = live.analyse(_result(tmp_path, drop=7))
    assert not gap.ok
    assert "rank 0 did not commit every step 1..10 exactly once: steps 1..10, [7] missing" in (
        gap.failed
    )
    unhealed = live.analyse(_result(tmp_path, heal=False))
    assert unhealed.failed == ["the replacement for rank 1 did not heal from a peer"]
    assert live.headline(unhealed).endswith(
        "FAILED: the replacement for rank 1 did not heal from a peer"
    )


def test_a_fault_that_never_fired_fails(tmp_path) -> None:
    result = _result(tmp_path)
    result.moments, result.problem = [], "the fault SIGKILL rank 1 in step 6 never fired"
    summary = live.analyse(result)
    assert "the fault SIGKILL rank 1 in step 6 never fired" in summary.failed


def test_the_report_writes_its_file_and_page(tmp_path, capsys) -> None:
    result = _result(tmp_path)
    assert live.report(result) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == live.headline(live.analyse(result))
    assert any(line.startswith("verdict: held: ranks 0, 2 committed") for line in out)
    doc = json.loads((result.run_dir / live.FILE).read_text())
    assert doc["ok"] and doc["last_step"] == 10 and doc["committed"]["1"] == [9, 10]
    assert any("quorum 2 formed" in line for line in doc["timeline"])
    assert (result.run_dir / "report.html").is_file()


def test_a_survivor_healed_after_being_left_out_holds_every_step_once() -> None:
    records = [
        *_commits(2, range(1, 6), 1, 3, 100.0),
        HealRecord(2, 3, 7, 0, 5000, 0.01, 101.0, 100.9, 99.0),
        *_commits(2, range(8, 11), 3, 3, 101.1),
    ]
    steps, healed = live._held_steps(records)
    assert steps == list(range(1, 11)) and healed == [6, 7]
