"""lab.report.report: a sweep's report, built one way from its summary, or why the
collected logs cannot give the figures."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from ddp.torchfree import Headline, Page
from lab.report.report import Closing, wrote_line
from lab.report.report import report as report_sweep
from lab.report.results import Results
from lab.report.summary import RunSummary, read_summary


def _result(tmp_path: Path) -> SimpleNamespace:
    return SimpleNamespace(run_dir=tmp_path / "r1", seconds=41.6, run_id="r1")


@dataclass
class _Summary:
    result: SimpleNamespace
    figure: float
    broken: str = ""


def _page(s: _Summary) -> Results:
    page = Page("t", Headline("cmd", s.broken or "ok", f"{s.figure:g}", not s.broken), [])
    return Results(page, RunSummary("t", "r1", "cmd", "now", 41.6, "", "ok", not s.broken))


def _files(s: _Summary) -> list[Path]:
    s.result.run_dir.mkdir(parents=True, exist_ok=True)
    (s.result.run_dir / "a.csv").write_text(f"{s.figure}\n")
    return [s.result.run_dir / "a.csv"]


def _report(result, analyse) -> int:
    def console(s: _Summary) -> Closing:
        return Closing([f"table {s.figure:g}"], [f"headline {s.figure:g}"])

    return report_sweep(result, analyse, files=_files, console=console, page=_page, name="t")


def test_every_renderer_is_given_the_summary_and_the_headline_is_last(tmp_path, capsys):
    result = _result(tmp_path)
    assert _report(result, lambda r: _Summary(r, 7.0)) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "table 7" and out[-1] == "headline 7"
    assert out[1] == f"took 42 s; wrote {result.run_dir}/: a.csv"
    assert (result.run_dir / "a.csv").read_text() == "7.0\n"
    assert (result.run_dir / "report.html").exists()


def test_what_broke_comes_before_the_headline_and_exits_1(tmp_path, capsys):
    assert _report(_result(tmp_path), lambda r: _Summary(r, 7.0, "parity BROKEN in: x")) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-2:] == ["parity BROKEN in: x", "headline 7"]


def test_logs_that_cannot_give_the_figures_are_an_error_line_and_a_failure_page(tmp_path, capsys):
    def analyse(result):
        raise ValueError("rank 1 has no end record")

    result = _result(tmp_path)
    assert _report(result, analyse) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: rank 1 has no end record (the logs are in {result.run_dir}/)\n")
    assert read_summary(result.run_dir).ok is False


def test_wrote_line_names_the_files():
    result = SimpleNamespace(run_dir=Path("runs/r1"), seconds=41.6)
    files = [Path("runs/r1/a.csv"), Path("runs/r1/b.png")]
    assert wrote_line(result, files) == "took 42 s; wrote runs/r1/: a.csv, b.png"
    assert wrote_line(result, files, took="sweep took").startswith("sweep took 42 s; ")
