"""`python -m lab parity DIR` on collected logs, and the archive extraction behind collection."""

import io
import tarfile

from ddp.program.records import ConfigRecord, EndRecord, RecordLog, StepRecord
from lab.cli import main
from lab.engine.cluster import _extract


def _write_run(logs, world=2, steps=3, diverge_at=None, drop_rank=None):
    logs.mkdir(parents=True)
    for rank in range(world):
        if rank == drop_rank:
            continue
        log = RecordLog(str(logs), rank)
        log.write(ConfigRecord(rank, world, 1, 0, {"steps": steps}))
        for step in range(1, steps + 1):
            checksum = 1.0 + step + (0.5 if rank == 1 and step == diverge_at else 0.0)
            ref = {"ref_loss": 2.0, "ref_checksum": checksum, "max_param_diff": 0.0}
            log.write(StepRecord(rank, step, 2.0, checksum, 4.0, 1.0, **(ref if rank == 0 else {})))
        log.write(EndRecord(rank, diverge_at is None, "00"))
        log.close()
    return logs


def test_parity_holds_from_the_run_dir_or_the_logs_dir(tmp_path, capsys):
    logs = _write_run(tmp_path / "run" / "train" / "logs")
    for where in (tmp_path / "run", tmp_path / "run" / "train", logs):
        assert main(["parity", str(where)]) == 0
        out = capsys.readouterr().out.strip().splitlines()
        assert out[-1].startswith("parity holds: 2 replicas")
        assert len(out) == 1 + 3 + 1  # header, 3 rows, verdict


def test_every_job_of_a_run_is_judged(tmp_path, capsys):
    _write_run(tmp_path / "run" / "reference" / "logs")
    _write_run(tmp_path / "run" / "fault" / "logs", diverge_at=2)
    assert main(["parity", str(tmp_path / "run")]) == 1
    out = capsys.readouterr().out
    assert "== " in out and "parity holds" in out and "replicas diverged at step 2" in out


def test_missing_rank_breaks_parity(tmp_path, capsys):
    run = _write_run(tmp_path / "run", world=4, drop_rank=3)
    assert main(["parity", str(run)]) == 1
    assert "no log from rank 3" in capsys.readouterr().out


def test_a_dir_without_logs_is_a_usage_error(tmp_path, capsys):
    try:
        main(["parity", str(tmp_path)])
    except SystemExit as e:
        assert e.code == 2
    assert "no rank*.jsonl logs under" in capsys.readouterr().err


def test_corrupt_log_is_reported_without_a_traceback(tmp_path, capsys):
    run = _write_run(tmp_path / "run")
    (run / "rank1.jsonl").write_text("{not json\n{}\n")
    assert main(["parity", str(run)]) == 1
    err = capsys.readouterr().err
    assert "rank1.jsonl:1: not a record" in err and "Traceback" not in err


def test_collected_archive_keeps_its_layout_and_cannot_escape(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("train/logs/rank0.jsonl", "train/logs/flight/r0.json", "train/../../x", "/a"):
            info = tarfile.TarInfo(name)
            info.size = 3
            tar.addfile(info, io.BytesIO(b"{}\n"))
        link = tarfile.TarInfo("train/link")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    _extract(buf.getvalue(), tmp_path / "out")
    files = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert files == ["out/logs/flight/r0.json", "out/logs/rank0.jsonl"]
