"""`python -m lab parity runs/<id>` on collected logs (the JSON-lines format of ddp --log-dir)."""

import io
import json
import tarfile

from lab.cli import main
from lab.cluster import _extract


def _write_run(run_dir, world=2, steps=3, diverge_at=None, drop_rank=None):
    logs = run_dir / "logs"
    logs.mkdir(parents=True)
    for rank in range(world):
        if rank == drop_rank:
            continue
        lines = [{"event": "config", "rank": rank, "world_size": world, "steps": steps}]
        for step in range(1, steps + 1):
            checksum = 1.0 + step + (0.5 if rank == 1 and step == diverge_at else 0.0)
            rec = {"event": "step", "rank": rank, "step": step, "loss": 2.0 - step / 10,
                   "checksum": checksum, "step_ms": 4.0, "comm_ms": 1.0}  # fmt: skip
            if rank == 0:
                rec |= {"ref_loss": rec["loss"], "ref_checksum": checksum, "max_param_diff": 0.0}
            lines.append(rec)
        lines.append({"event": "end", "rank": rank, "parity": diverge_at is None})
        (logs / f"rank{rank}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run_dir


def test_parity_holds(tmp_path, capsys):
    run = _write_run(tmp_path / "run")
    assert main(["parity", str(run)]) == 0
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1].startswith("parity holds: 2 replicas")
    assert len(out.strip().splitlines()) == 1 + 3 + 1  # header, 3 rows, verdict


def test_parity_accepts_the_logs_dir_itself(tmp_path, capsys):
    run = _write_run(tmp_path / "run")
    assert main(["parity", str(run / "logs")]) == 0


def test_diverged_replicas_break_parity(tmp_path, capsys):
    run = _write_run(tmp_path / "run", diverge_at=2)
    assert main(["parity", str(run)]) == 1
    assert "parity broken: replicas diverged at step 2" in capsys.readouterr().out


def test_missing_rank_breaks_parity(tmp_path, capsys):
    run = _write_run(tmp_path / "run", world=4, drop_rank=3)
    assert main(["parity", str(run)]) == 1
    assert "no log from rank 3" in capsys.readouterr().out


def test_no_logs_is_an_error_saying_what_to_pass(tmp_path, capsys):
    assert main(["parity", str(tmp_path)]) == 1
    assert "no rank*.jsonl logs" in capsys.readouterr().err


def test_collected_archive_keeps_its_layout_and_cannot_escape(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("logs/rank0.jsonl", "logs/flight/rank0.json", "logs/../../evil", "/abs"):
            info = tarfile.TarInfo(name)
            info.size = 3
            tar.addfile(info, io.BytesIO(b"{}\n"))
        link = tarfile.TarInfo("logs/link")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    _extract(buf.getvalue(), tmp_path / "out" / "logs")
    files = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert files == ["out/logs/flight/rank0.json", "out/logs/rank0.jsonl"]


def test_corrupt_log_is_reported(tmp_path, capsys):
    run = _write_run(tmp_path / "run")
    (run / "logs" / "rank1.jsonl").write_text("{not json\n{}\n")
    assert main(["parity", str(run)]) == 1
    assert "not a JSON line" in capsys.readouterr().err
