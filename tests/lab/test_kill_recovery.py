"""lab kill --recover's bitwise comparison, from logs written by ddp's own record writer."""

from ddp.program.records import ConfigRecord, EndRecord, RecordLog, StepRecord, load_run
from lab.experiments.kill.restart import IDENTICAL, compare_runs


def _write(log_dir, rank, start_step, sha, parity=True, end=True, torn=False):
    log = RecordLog(str(log_dir), rank)
    log.write(ConfigRecord(rank, 4, 1, start_step))
    for step in range(start_step + 1, 7):
        log.write(StepRecord(rank, step, 2.0, 1.0, 3.0, 1.0))
    if end:
        log.write(EndRecord(rank, parity, sha))
    log.close()
    if torn:  # a rank killed mid-write leaves a torn last line: dropped, never a crash
        with open(log_dir / f"rank{rank}.jsonl", "a") as f:
            f.write('{"event": "st')


def _runs(tmp_path, resumed_sha=lambda r: "ab" * 32, **kw):
    ref, res = tmp_path / "reference", tmp_path / "resume"
    for r in range(4):
        _write(ref, r, 0, "ab" * 32)
        _write(res, r, 2, resumed_sha(r), torn=r == 1, **kw)
    return load_run(ref), load_run(res)


def test_identical_final_parameters_recover(tmp_path):
    got = compare_runs(*_runs(tmp_path), 4)
    assert got.ok and got.resumed_from == 2
    assert got.last_line == IDENTICAL
    assert got.details[0] == "rank 0 abababababab.. = abababababab.."


def test_one_differing_rank_fails_and_is_named(tmp_path):
    got = compare_runs(*_runs(tmp_path, lambda r: "cd" * 32 if r == 3 else "ab" * 32), 4)
    assert not got.ok and "DIFFER" in got.last_line and "on ranks 3 " in got.last_line


def test_a_missing_end_record_or_broken_parity_cannot_compare(tmp_path):
    got = compare_runs(*_runs(tmp_path, end=False), 4)
    assert not got.ok and "no end record for rank 0" in got.last_line
    broken = compare_runs(*_runs(tmp_path / "b", parity=False), 4)
    assert not broken.ok and "parity broken (rank 0)" in broken.last_line
    nothing = compare_runs({}, {}, 2)
    assert not nothing.ok and nothing.resumed_from is None
