"""Reading an elastic restart back, pure: the workers to kill, the timeline, the bitwise verdict."""

from ddp.program.records import (
    ConfigRecord,
    EndRecord,
    RankLog,
    RecordLog,
    StepRecord,
    VerdictRecord,
    load_attempts,
    load_run,
)
from lab.engine.events import ExitEvent, LineEvent, RecordEvent
from lab.experiments.kill.torchrun import compare_final, restart_timeline, worker_pids

PS = """\
    1 sleep 900
   14 /opt/venv/bin/python /opt/venv/bin/torchrun --nnodes 2 -m ddp train --steps 10
   38 /opt/venv/bin/python3 -u -m ddp train --steps 10
   37 /opt/venv/bin/python3 -u -m ddp train --steps 10
   50 ps -eo pid=,args=
"""


def test_worker_pids_are_the_agents_children_not_the_agent():
    assert worker_pids(PS) == [37, 38]
    assert worker_pids("") == []


def _log(rank, sha, start=0, parity=True):
    return RankLog(rank, [ConfigRecord(rank, 2, 1, start), EndRecord(rank, parity, sha)])


def test_compare_final_is_bitwise_per_rank():
    ref = {0: _log(0, "ab" * 32), 1: _log(1, "ab" * 32)}
    same = compare_final(ref, {0: _log(0, "ab" * 32, 4), 1: _log(1, "ab" * 32, 4)})
    assert same.ok and same.resumed_after == 4 and "bitwise identical" in same.line
    differ = compare_final(ref, {0: _log(0, "ab" * 32, 4), 1: _log(1, "cd" * 32, 4)})
    assert not differ.ok and "DIFFER" in differ.line and "ranks 1" in differ.line
    broken = compare_final(ref, {0: _log(0, "ab" * 32, 4, parity=False)})
    assert not broken.ok and "cannot compare" in broken.line
    assert "no end record for rank 1" in broken.line


def test_the_timeline_runs_from_the_fault_to_the_exits():
    t = 100.0
    events = [
        RecordEvent(t - 1, 0, 0, StepRecord(0, 5, 1.0, 1.0, 1.0, 1.0)),  # before: left out
        LineEvent(t + 0.8, 1, 1, "E1201 api.py:1002] failed (exitcode: -9) local_rank: 1"),
        RecordEvent(t + 30, 0, 0, ConfigRecord(0, 4, 1, 4)),
        RecordEvent(t + 30.1, 1, 1, ConfigRecord(2, 4, 1, 4)),
        RecordEvent(t + 31, 0, 0, StepRecord(0, 5, 1.0, 1.0, 1.0, 1.0)),
        RecordEvent(t + 33, 0, 0, VerdictRecord(0, True, "parity holds")),
        ExitEvent(t + 50, 0, 0, 0),
    ]
    lines = restart_timeline(events, t, "SIGKILL worker pid 38 on node1")
    assert lines == [
        "   +0.00 s  fault: SIGKILL worker pid 38 on node1",
        "   +0.80 s  node1 agent: failed (exitcode: -9) local_rank: 1",
        "  +30.00 s  workers restarted: rank 0 (node0) set up, resuming after step 4",
        "  +31.00 s  rank 0 (node0) trains step 5",
        "  +33.00 s  verdict: parity holds",
        "  +50.00 s  node0: torchrun exited 0",
    ]


def test_a_timeline_without_a_restart_says_so():
    lines = restart_timeline([], 5.0, "SIGKILL")
    assert lines[-1].endswith("no worker restarted after the fault")


def _write(log_dir, rank, *records):
    log = RecordLog(str(log_dir), rank)
    for record in records:
        log.write(record)
    log.close()


def test_compare_final_reads_the_restarted_attempt_from_the_collected_logs(tmp_path):
    """A worker torchrun restarted keeps its first log; the newest attempt is compared."""
    sha = "ef" * 32
    for rank in (0, 1):
        _write(tmp_path / "plain", rank, ConfigRecord(rank, 2, 1, 0), EndRecord(rank, True, sha))
        _write(tmp_path / "restarted", rank, ConfigRecord(rank, 2, 1, 0))  # killed: no end
        _write(
            tmp_path / "restarted", rank, ConfigRecord(rank, 2, 1, 4), EndRecord(rank, True, sha)
        )
    attempts = load_attempts(tmp_path / "restarted")
    assert {r: [a.attempt for a in logs] for r, logs in attempts.items()} == {0: [0, 1], 1: [0, 1]}
    recovered = compare_final(load_run(tmp_path / "plain"), load_run(tmp_path / "restarted"))
    assert recovered.ok and recovered.resumed_after == 4, recovered.line
