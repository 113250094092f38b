"""lab.experiments.reporting: a sweep's figures, or why the collected logs cannot give them."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from lab.experiments.reporting import written, wrote_line

RESULT = SimpleNamespace(run_dir=Path("runs/r1"), seconds=41.6)


def test_written_returns_the_outputs():
    assert written(lambda result: ("out", result.seconds), RESULT) == ("out", 41.6)


def test_logs_that_cannot_give_the_figures_are_an_error_line_not_a_traceback(capsys):
    def broken(result):
        raise ValueError("rank 1 has no end record")

    assert written(broken, RESULT) is None
    err = capsys.readouterr().err
    assert err == "error: rank 1 has no end record (the logs are in runs/r1/)\n"


def test_wrote_line_names_the_files():
    files = [Path("runs/r1/a.csv"), Path("runs/r1/b.png")]
    assert wrote_line(RESULT, files) == "took 42 s; wrote runs/r1/: a.csv, b.png"
    assert wrote_line(RESULT, files, took="sweep took").startswith("sweep took 42 s; ")
