"""lab kill --launcher torchrun's verdict and report, from synthetic runs: recovery is verified
only when every check holds, and each way it can fail says so (and exits 1)."""

import dataclasses
import json
from pathlib import Path

from ddp.program.records import ConfigRecord, EndRecord, RankLog, StepRecord, VerdictRecord
from lab.engine.events import ExitEvent, LineEvent, RecordEvent
from lab.experiments.kill import report
from lab.experiments.kill.torchrun import (
    JobOutcome,
    TorchrunKillPlan,
    TorchrunKillResult,
    TorchrunSummary,
    WorkerKill,
    judge,
    write_files,
)

SHA = "8c" * 32
T = 1000.0  # the kill


def _logs(sha=SHA, start=0, parity=True):
    return {
        r: RankLog(r, [ConfigRecord(r, 4, 1, start), EndRecord(r, parity, sha)], attempt=start // 4)
        for r in range(4)
    }


def _events(start=4, ranks=range(4), holds=True):
    events = [
        RecordEvent(T - 2, 0, 0, ConfigRecord(0, 4, 1, 0, pid=30)),  # before the fault
        RecordEvent(T - 0.1, 1, 1, StepRecord(3, 4, 1.0, 1.0, 1.0, 1.0)),
        LineEvent(T + 0.6, 1, 1, "E1201 api.py:1002] failed (exitcode: -9) local_rank: 1"),
    ]
    events += [
        RecordEvent(T + 9 + r / 10, r // 2, r // 2, ConfigRecord(r, 4, 1, start)) for r in ranks
    ]
    events += [
        RecordEvent(T + 9.6, 0, 0, StepRecord(0, start + 1, 1.0, 1.0, 1.0, 1.0)),
        RecordEvent(
            T + 10.4, 0, 0, VerdictRecord(0, holds, f"parity {'holds' if holds else 'broken'}")
        ),
        ExitEvent(T + 15.6, 1, 1, 0),
        ExitEvent(T + 15.9, 0, 0, 0),
    ]
    return events


def _result(tmp_path, **changes):
    plan = TorchrunKillPlan(rank=3, at_step=5, runs_dir=tmp_path)
    result = TorchrunKillResult(
        plan,
        "run-1",
        Path(tmp_path) / "run-1",
        JobOutcome("reference", T - 60, T - 25, {0: 0, 1: 0}),
        JobOutcome("fault", T - 17.4, T + 15.9, {0: 0, 1: 0}),
        WorkerKill(3, 1, 37, "rank 3 reported step 4 done", T - 0.1, T, T + 0.26, 0),
        _events(),
        {"reference": _logs(), "fault": _logs(start=4)},
        {r: [4, 8] for r in range(4)},
        72.0,
    )
    return dataclasses.replace(result, **changes)


def test_a_recovered_run_passes_every_check_and_prints_its_timeline(tmp_path):
    verdict = judge(_result(tmp_path))
    assert verdict.ok and verdict.restarted == {0: 4, 1: 4, 2: 4, 3: 4}
    lines = verdict.lines()
    assert lines[:8] == [
        "restart timeline (seconds from the fault; the fault came 17.40 s in):",
        "   +0.00 s  fault: SIGKILL rank 3's worker (pid 37) on node1",
        "   +0.60 s  node1 agent: failed (exitcode: -9) local_rank: 1",
        "   +9.00 s  workers restarted: rank 0 (node0) set up, resuming after step 4",
        "   +9.60 s  rank 0 (node0) trains step 5",
        "  +10.40 s  verdict: parity holds",
        "  +15.60 s  node1: torchrun exited 0",
        "  +15.90 s  node0: torchrun exited 0",
    ]
    assert all(line.startswith("  ok    ") for line in lines[9:14]), lines
    assert "the restarted workers resumed after step 4" in lines[12]
    assert lines[-2].startswith("sha256 of the final parameters, restarted vs uninterrupted: ")
    assert "rank 3 8c8c8c8c8c8c.. = 8c8c8c8c8c8c.." in lines[-2]
    assert lines[-1].startswith("recovered: final parameters of all 4 ranks bitwise identical")


def _failed(verdict) -> list[str]:
    return [c.text for c in verdict.checks if not c.ok]


def test_each_way_recovery_fails_is_named(tmp_path):
    differ = judge(_result(tmp_path, logs={"reference": _logs(), "fault": _logs("ab" * 32, 4)}))
    assert not differ.ok and _failed(differ) == [] and "DIFFER" in differ.recovered.line
    assert "rank 0 abababababab.. != 8c8c8c8c8c8c.." in differ.lines()[-2]

    missed = WorkerKill(
        3, 1, 37, "rank 3 reported step 4 done", T - 0.1, T, T + 0.2, 1, "No such process"
    )
    failed = judge(_result(tmp_path, kill=missed))
    assert not failed.ok and "kill exited 1 (No such process)" in _failed(failed)[0]

    partial = judge(_result(tmp_path, events=_events(ranks=range(3))))
    assert not partial.ok and _failed(partial) == [
        "ranks [3] were not set up again after the fault (of 4)"
    ]

    fresh = judge(
        _result(tmp_path, events=_events(start=0), logs={"reference": _logs(), "fault": _logs()})
    )
    assert not fresh.ok and "started fresh (step 0)" in _failed(fresh)[0]

    later = judge(
        _result(tmp_path, events=_events(start=6), attempt_steps={r: [4, 8] for r in range(4)})
    )
    assert not later.ok and "resumed after step 6" in _failed(later)[0]  # no such checkpoint then

    crashed = JobOutcome("fault", T - 17.4, T + 15.9, {0: 0, 1: 1})
    exited = judge(_result(tmp_path, fault=crashed, events=_events(holds=False)))
    assert (
        not exited.ok and "node1 1" in _failed(exited)[0] and "parity broken" in _failed(exited)[0]
    )

    hung = JobOutcome("reference", T - 60, None, {0: 0}, running=[1])
    stuck = judge(_result(tmp_path, reference=hung))
    assert not stuck.ok and "still running at the deadline: nodes [1]" in _failed(stuck)[0]


def test_the_report_json_and_the_exit_code(tmp_path, capsys):
    assert report(_result(tmp_path)) == 0
    data = json.loads((tmp_path / "run-1" / "report.json").read_text())
    assert data["ok"] and data["bitwise_equal"] and data["resumed_after"] == 4
    assert data["plan"]["launcher"] == "torchrun" and data["plan"]["train"]["auto_resume"]
    assert data["final_params_sha256"]["3"] == {"reference": SHA, "restarted": SHA, "equal": True}
    assert data["kill"]["pid"] == 37 and data["phases"]["fault"]["exit_codes"] == {"0": 0, "1": 0}
    assert data["timeline"][1].endswith("node1 agent: failed (exitcode: -9) local_rank: 1")
    assert "recovered: final parameters of all 4 ranks" in capsys.readouterr().out
    broken = _result(tmp_path, logs={"reference": _logs(), "fault": _logs("ab" * 32, 4)})
    assert report(broken) == 1
    assert not json.loads(write_files(TorchrunSummary(broken, judge(broken)))[0].read_text())["ok"]


def test_a_lost_host_is_judged_on_the_new_world_alone(tmp_path):
    """--mode host: nodes 0,1 x 2 workers, node1's host goes; ranks 0,1 start a world of 2
    from step 0 and end with parity, identical to each other (not to the world of 4)."""
    train = TorchrunKillPlan(0, 5).train.replace(checkpoint_every=0)
    plan = TorchrunKillPlan(
        rank=0, at_step=5, mode="host", lost=(1,), train=train, procs_per_node=2, runs_dir=tmp_path
    )
    survivors = {
        r: RankLog(r, [ConfigRecord(r, 2, 1, 0), EndRecord(r, True, "ab" * 32)]) for r in range(2)
    }
    lost = WorkerKill(
        0,
        1,
        0,
        "rank 0 reported step 4 done",
        T - 0.1,
        T,
        T + 0.3,
        0,
        "",
        "host1 down: docker kill of node1 at once (ranks [2, 3], ...)",
    )
    result = _result(
        tmp_path,
        plan=plan,
        kill=lost,
        events=_events(start=0, ranks=range(2)),
        fault=JobOutcome("fault", T - 17.4, T + 15.9, {0: 0, 1: 137}),
        logs={"reference": _logs(), "fault": survivors},
    )
    verdict = judge(result)
    assert verdict.ok, verdict.lines()
    lines = verdict.lines()
    assert "   +0.00 s  fault: host1 down: docker kill of node1 at once" in lines[1]
    assert "the new world started fresh (step 0)" in "\n".join(lines)
    assert lines[-1].startswith("survived: the 2 ranks left trained a new world from step 0")
    assert verdict.to_dict()["bitwise_equal"] is False
    broken = {0: survivors[0], 1: RankLog(1, [ConfigRecord(1, 2, 1, 0)])}
    assert not judge(dataclasses.replace(result, logs={"fault": broken})).ok
    # the lost host's torchrun must not have exited 0, the others must have
    clean = JobOutcome("fault", T - 17.4, T + 15.9, {0: 0, 1: 0})
    assert not judge(dataclasses.replace(result, fault=clean)).ok
