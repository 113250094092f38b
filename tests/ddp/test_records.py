"""The log schema: one writer, one reader, one rule for a torn last line."""

import json

import pytest

from ddp.program.records import (
    RECORD_PREFIX,
    ConfigRecord,
    EndRecord,
    FailureRecord,
    LogError,
    RecordLog,
    StepRecord,
    VerdictRecord,
    load_attempts,
    load_run,
    log_name,
    parse_record_line,
    read_rank_log,
)


def _records(rank=1):
    return [
        ConfigRecord(rank, 2, 3, 0, {"steps": 2}),
        StepRecord(
            rank, 1, 2.0, 1.5, 4.0, 1.0, t0=1.0, backward_ms=[0.1, 2.0], buckets_ms=[[1.0, 3.0]]
        ),
        StepRecord(rank, 2, 1.9, 1.4, 4.1, 1.1),
        VerdictRecord(rank, True, "parity holds: ..."),
        EndRecord(rank, True, "ab" * 32),
    ]


def test_write_then_read_gives_the_same_records(tmp_path, capsys):
    log = RecordLog(str(tmp_path), 1, echo=True)
    for r in _records():
        log.write(r)
    log.close()
    got = read_rank_log(tmp_path / "rank1.jsonl")
    assert got.records == _records() and not got.torn
    assert [s.step for s in got.steps] == [1, 2]
    assert got.config.num_buckets == 3 and got.verdict.holds and got.end.parity
    assert got.failure is None
    echoed = [parse_record_line(line) for line in capsys.readouterr().out.splitlines()]
    assert echoed == _records()


def test_torn_last_line_is_dropped_and_flagged(tmp_path):
    path = tmp_path / "rank0.jsonl"
    path.write_text("\n".join(r.to_json() for r in _records(0)[:2]) + '\n{"event": "st')
    log = read_rank_log(path)
    assert log.torn and len(log.records) == 2
    path.write_text(_records(0)[0].to_json() + "\n\n")  # trailing blank lines are fine
    assert not read_rank_log(path).torn


def test_corruption_before_the_last_line_names_file_and_line(tmp_path):
    path = tmp_path / "rank0.jsonl"
    path.write_text(_records(0)[0].to_json() + "\nnot json\n" + _records(0)[2].to_json() + "\n")
    with pytest.raises(LogError, match=r"rank0\.jsonl:2"):
        read_rank_log(path)
    path.write_text(json.dumps({"event": "step", "rank": 0}) + "\n{}\n")
    with pytest.raises(LogError, match=r":1: not a record \(step record"):
        read_rank_log(path)


def test_unknown_events_and_keys_are_skipped(tmp_path):
    """A newer writer's records do not break an older reader."""
    path = tmp_path / "rank3.jsonl"
    fail = FailureRecord(3, "diagnosis: rank 1 missing", [1])
    data = {**json.loads(fail.to_json()), "extra": 1}
    path.write_text(json.dumps({"event": "hello", "rank": 3}) + "\n" + json.dumps(data) + "\n")
    assert read_rank_log(path).records == [fail]


def test_stdout_lines(tmp_path):
    line = RECORD_PREFIX + _records()[2].to_json()
    assert parse_record_line(line) == _records()[2]
    assert parse_record_line(line[:-5]) is None  # cut short
    assert parse_record_line("    2   2.0 ...") is None  # a human line
    # another rank's unbuffered print, its newline not written yet when this record came
    assert parse_record_line("rank 0: parameters sha256 8de7ddf8cc5dc536" + line) == _records()[2]
    assert parse_record_line("mail me @ddp later") is None


def test_load_run_by_rank(tmp_path):
    for rank in (0, 2):  # rank 1's log is missing: a world of 3 with a gap
        RecordLog(str(tmp_path), rank).write(ConfigRecord(rank, 3, 1, 0, {}))
    (tmp_path / "rankX.jsonl").write_text("")
    assert sorted(load_run(tmp_path)) == [0, 2]
    assert load_run(tmp_path / "missing") == {}


def test_a_second_writer_of_a_rank_keeps_the_first_attempt(tmp_path):
    """torchrun restarts a worker with the same command line: its earlier log survives, torn
    last line and all, and the newest attempt is what the run ended with."""
    first = RecordLog(str(tmp_path), 1)
    first.write(_records()[0])
    first.close()
    with open(tmp_path / "rank1.jsonl", "a") as f:
        f.write('{"event": "st')  # killed mid-write
    for _ in range(2):
        again = RecordLog(str(tmp_path), 1)
        for r in _records():
            again.write(r)
        again.close()
    assert again.path == tmp_path / log_name(1, 2) == tmp_path / "rank1.attempt2.jsonl"
    attempts = load_attempts(tmp_path)[1]
    assert [(a.attempt, a.torn, len(a.records)) for a in attempts] == [
        (0, True, 1),
        (1, False, 5),
        (2, False, 5),
    ]
    newest = load_run(tmp_path)[1]
    assert newest.attempt == 2 and newest.end.parity and newest.records == _records()
    assert read_rank_log(tmp_path / "rank1.attempt1.jsonl").rank == 1


def test_ranks_of_a_world_that_shrank_away_are_not_in_the_run(tmp_path):
    """A node gone for good: the survivors restart as a world of 2; rank 2's only log is
    of the world of 3, and load_run leaves it out (load_attempts keeps it)."""
    for rank in range(3):
        RecordLog(str(tmp_path), rank).write(ConfigRecord(rank, 3, 1, 0, {}))
    for rank in range(2):
        RecordLog(str(tmp_path), rank).write(ConfigRecord(rank, 2, 1, 0, {}))
    assert sorted(load_run(tmp_path)) == [0, 1]
    assert sorted(load_attempts(tmp_path)) == [0, 1, 2]


def test_attempt_files_of_other_names_are_not_rank_logs(tmp_path):
    RecordLog(str(tmp_path), 0).write(_records(0)[0])
    for name in ("rank0.attemptX.jsonl", "rank0.1.jsonl", "rank.attempt1.jsonl"):
        (tmp_path / name).write_text("not json\nnot json\n")
    assert [a.attempt for a in load_attempts(tmp_path)[0]] == [0]
    with pytest.raises(LogError, match="not a rank log name"):
        read_rank_log(tmp_path / "rank0.1.jsonl")
