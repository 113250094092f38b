"""A ``Manager`` given no ``record=`` writes its records where the environment says
(``DDP_LOG_DIR``, ``DDP_EMIT_RECORDS``): what ``lab run --recovery live`` relies on, so a
user's loop adds nothing to be followed and judged. The sink itself, without a control plane."""

from __future__ import annotations

from ddp.program.records import RECORD_PREFIX, load_attempts, parse_record_line
from ddp.recovery.api import env_record_log
from ddp.recovery.records import CommitRecord


def test_no_log_dir_means_no_records(monkeypatch) -> None:
    monkeypatch.delenv("DDP_LOG_DIR", raising=False)
    assert env_record_log(1) is None


def test_the_replica_s_log_and_a_replacement_s_attempt(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setenv("DDP_LOG_DIR", str(tmp_path))
    monkeypatch.setenv("DDP_EMIT_RECORDS", "1")
    first = env_record_log(1)
    assert first is not None
    first.write(CommitRecord(1, 5, 1, 3, True, 10.0))
    first.close()
    echoed = [line for line in capsys.readouterr().out.splitlines() if line]
    assert echoed and echoed[0].startswith(RECORD_PREFIX)
    assert parse_record_line(echoed[0]) == CommitRecord(1, 5, 1, 3, True, 10.0)
    monkeypatch.setenv("DDP_EMIT_RECORDS", "0")
    again = env_record_log(1)  # the replacement, same RANK, same directory
    assert again is not None
    again.write(CommitRecord(1, 9, 3, 3, True, 20.0))
    again.close()
    assert capsys.readouterr().out == ""
    attempts = load_attempts(tmp_path)[1]
    assert [a.attempt for a in attempts] == [0, 1]
    assert [a.records[0].step for a in attempts] == [5, 9]
