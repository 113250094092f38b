"""``python -m lab runs``: newest first from each run's summary.json; partial and garbage
folders listed as such, never a crash; --show; --compare of two runs of one experiment, and a
one-line refusal (exit 2) of an unknown id or of runs of different experiments."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from lab.cli import main
from lab.report.summary import RunSummary, write_summary

ROOT = Path(__file__).resolve().parents[2]


def _run(runs: Path, run_id: str, experiment: str, started: str, configs: dict) -> None:
    write_summary(
        runs / run_id,
        RunSummary(
            experiment,
            run_id,
            f"python -m lab {experiment}",
            started,
            95.0,
            "bucketing 1.7x, overlap 1.4x" if experiment == "latency" else "rank 2 missing",
            "parity holds in every allreduce configuration",
            True,
            configs,
        ),
    )


@pytest.fixture
def runs(tmp_path) -> Path:
    runs = tmp_path / "runs"
    _run(
        runs,
        "20250101-100000-aaaa",
        "latency",
        "2025-01-01T10:00:00",
        {"5 ms, per-parameter, overlap on": 900.0, "5 ms, cap 0.15 MB, overlap on": 500.0},
    )
    _run(
        runs,
        "20250102-100000-bbbb",
        "latency",
        "2025-01-02T10:00:00",
        {
            "5 ms, per-parameter, overlap on": 990.0,
            "5 ms, cap 0.15 MB, overlap on": 400.0,
            "5 ms, no sync (floor)": 100.0,
        },
    )
    _run(runs, "20250103-100000-cccc", "kill", "2025-01-03T10:00:00", {})
    (runs / "20250104-100000-dddd" / "fault").mkdir(parents=True)  # interrupted: no summary
    (runs / "20250104-100000-dddd" / "report.json").write_text("{}")
    (runs / "garbage").mkdir()
    (runs / "garbage" / "summary.json").write_text("{not json")
    (runs / "half").mkdir()
    (runs / "half" / "summary.json").write_text(json.dumps({"experiment": "up"}))
    (runs / "stray.txt").write_text("not a run")
    # without a summary a run is placed by its folder's last change
    for name, when in (
        ("20250104-100000-dddd", "2025-01-04T10:00:00"),
        ("garbage", "2024-12-01T00:00:00"),
        ("half", "2024-11-01T00:00:00"),
    ):
        stamp = datetime.fromisoformat(when).timestamp()
        os.utime(runs / name, (stamp, stamp))
    return runs


def _lab(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["runs", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_list_is_newest_first_and_survives_partial_and_garbage_runs(runs, capsys):
    code, out, err = _lab(capsys, "--runs-dir", str(runs))
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["run", "id", "experiment", "started"]
    ids = [line.split()[0] for line in lines[1:]]
    assert ids == [
        "20250104-100000-dddd",
        "20250103-100000-cccc",
        "20250102-100000-bbbb",
        "20250101-100000-aaaa",
        "garbage",
        "half",
    ]
    row = {line.split()[0]: line for line in lines[1:]}
    assert "latency" in row["20250102-100000-bbbb"] and "2025-01-02 10:00:00" in out
    assert "95 s" in row["20250102-100000-bbbb"]
    assert "bucketing 1.7x, overlap 1.4x" in row["20250102-100000-bbbb"]
    assert "ok: parity holds in every allreduce configuration" in row["20250102-100000-bbbb"]
    assert "kill?" in row["20250104-100000-dddd"] and "partial: no summary.json" in out
    assert "partial: summary.json unreadable" in row["garbage"]
    assert "partial: summary.json lacks run_id" in row["half"]


def test_show_prints_one_summary_again(runs, capsys):
    code, out, _ = _lab(capsys, "--runs-dir", str(runs), "--show", "20250102-100000-bbbb")
    assert code == 0
    assert "run 20250102-100000-bbbb (latency), started 2025-01-02 10:00:00, took 95 s" in out
    assert "figure: bucketing 1.7x, overlap 1.4x" in out
    assert re.search(r"^5 ms, cap 0.15 MB, overlap on +400.0$", out, re.M)
    assert "report: none written" in out
    code, out, _ = _lab(capsys, "--runs-dir", str(runs), "--show", "20250104")  # a prefix
    assert code == 0 and "partial: no summary.json" in out


def test_compare_sets_the_configurations_side_by_side(runs, capsys):
    code, out, _ = _lab(
        capsys, "--runs-dir", str(runs), "--compare", "20250101-100000-aaaa", "20250102-100000-bbbb"
    )
    assert code == 0
    assert "2 configurations in both" in out
    row = next(line for line in out.splitlines() if "cap 0.15 MB" in line)
    assert row.split()[-3:] == ["500.0", "400.0", "0.80x"]
    floor = next(line for line in out.splitlines() if "no sync" in line)
    assert floor.split()[-3:] == ["-", "100.0", "-"]  # only in the second run


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--compare", "20250101-100000-aaaa", "20250103-100000-cccc"],
            "error: runs of different experiments: 20250101-100000-aaaa is latency, "
            "20250103-100000-cccc is kill",
        ),
        (["--compare", "20250101-100000-aaaa", "nope"], "error: no run 'nope' in "),
        (["--show", "nope"], "error: no run 'nope' in "),
        (["--show", "2025"], "error: run id '2025' is ambiguous"),
        (
            ["--compare", "20250101-100000-aaaa", "garbage"],
            "error: run garbage cannot be compared: summary.json unreadable",
        ),
    ],
)
def test_bad_ids_are_refused_in_one_line_with_exit_2(runs, capsys, argv, message):
    code, out, err = _lab(capsys, "--runs-dir", str(runs), *argv)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith(message), err


def test_no_runs_folder_is_an_empty_list(tmp_path, capsys):
    code, out, _ = _lab(capsys, "--runs-dir", str(tmp_path / "none"))
    assert code == 0 and out.strip() == f"no runs in {tmp_path / 'none'}/"


def test_the_command_line_exits_2_for_an_unknown_id(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "lab", "runs", "--runs-dir", str(tmp_path), "--show", "x"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1


def test_a_bench_folder_is_listed_from_its_bench_json(tmp_path, capsys):
    """``python -m ddp.bench --out DIR`` writes no summary: its targets stand in for one."""
    ratios = {
        "ours/torch step time": {"ratio": 1.031, "target": 1.0, "met": False},
        "one node: ours+hierarchical/ours": {"ratio": 1.01, "target": 1.02, "met": True},
        "skipped": {"ratio": None, "target": 1.03, "met": None},
    }
    bench = tmp_path / "bench18"
    bench.mkdir()
    (bench / "bench.json").write_text(
        json.dumps(
            {
                "command": "python -m ddp.bench",
                "ratios": ratios,
                "medians_ms": {"multi": {"ours@64": 93.0, "torch@64": 89.3}},
            }
        )
    )
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "bench.json").write_text("{")
    assert main(["runs", "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("bench18"))
    assert (
        "ddp.bench" in line and "ours/torch 1.031, one node: ours+hierarchical/ours 1.010" in line
    )
    assert "targets not met: ours/torch step time" in line
    assert "bench.json unreadable (JSONDecodeError)" in out
