"""Pure logic: the parity judge and the offline log check."""

import pytest

from ddp.program.parity import check_logs
from ddp.program.records import ConfigRecord, RecordLog, StepRecord


def _write_run(tmp_path, world, steps, *, diverge_at=None, ref_diff=1e-8, torn=False):
    for rank in range(world):
        log = RecordLog(str(tmp_path), rank)
        log.write(ConfigRecord(rank, world, 1, 0, {"steps": steps, "tolerance": 1e-5}))
        for s in range(1, steps + 1):
            checksum = 10.0 + s + (rank * 1e-3 if diverge_at and s >= diverge_at else 0)
            ref = {}
            if rank == 0:
                ref = {"ref_loss": 1.0 / s, "ref_checksum": 10.0 + s, "max_param_diff": ref_diff}
            log.write(StepRecord(rank, s, 1.0 / s, checksum, 5.0, 1.0, **ref))
        log.close()
        if torn and rank == 1:
            with open(tmp_path / f"rank{rank}.jsonl", "a") as f:
                f.write('{"event": "step", "ra')


def test_check_logs_holds(tmp_path):
    _write_run(tmp_path, 3, 4, torn=True)
    report = check_logs(tmp_path)
    assert report.holds, report.verdict
    assert report.verdict.startswith("parity holds: 3 replicas identical after all 4 steps")
    assert len(report.table().splitlines()) == 5


def test_check_logs_detects_divergence_reference_gap_and_missing_rank(tmp_path):
    _write_run(tmp_path, 2, 4, diverge_at=3)
    assert check_logs(tmp_path).verdict.startswith("parity broken: replicas diverged at step 3")
    _write_run(tmp_path, 2, 4, ref_diff=1e-3)
    assert "differ from the single-process reference" in check_logs(tmp_path).verdict
    _write_run(tmp_path, 3, 4)
    (tmp_path / "rank2.jsonl").unlink()
    assert "no log from rank 2" in check_logs(tmp_path).verdict


def test_check_logs_without_logs_says_what_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"rank\*\.jsonl"):
        check_logs(tmp_path)


def test_compression_reports_the_reference_gap_but_judges_only_replicas(tmp_path):
    _write_run(tmp_path, 2, 3, ref_diff=1e-3)
    assert not check_logs(tmp_path).holds  # an exact run that far off breaks parity
    from ddp.program.parity import ParityReport

    rows = check_logs(tmp_path).rows
    report = ParityReport(rows, 2, 1e-5, compression="fp16")
    assert report.holds and "fp16 compression on" in report.verdict and "1.0e-03" in report.verdict
    _write_run(tmp_path, 2, 3, diverge_at=2)
    diverged = ParityReport(check_logs(tmp_path).rows, 2, 1e-5, compression="fp16")
    assert not diverged.holds and "replicas diverged at step 2" in diverged.verdict
