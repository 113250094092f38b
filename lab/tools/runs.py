"""``python -m lab runs``: the past runs in runs/ (or --runs-dir), newest first; one run's
summary again (--show ID); two runs of one experiment side by side (--compare ID1 ID2)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

from lab.report.runs import find_run, scan_runs
from lab.report.runs_text import compare_lines, list_lines, show_lines

NAME = "runs"
HELP = "list past runs (newest first), show one, or compare two of one experiment"
DESCRIPTION = (
    "Read every run's summary.json in the runs folder: its id, experiment, when it started, "
    "how long it took, its headline figure and its verdict. A folder without a readable "
    "summary (an interrupted run, a partial copy) is listed as partial."
)
EPILOG = """\
examples:
  python -m lab runs
  python -m lab runs --show 20250101-120000-ab12
  python -m lab runs --compare ID1 ID2     # same configurations, step times, ratio ID2/ID1
Exit codes: 0 listed, 2 an unknown run id, runs of different experiments, or a run without a
readable summary to show or compare."""


@dataclass(frozen=True)
class RunsPlan:
    runs_dir: Path
    show: str | None = None
    compare: tuple[str, ...] = field(default_factory=tuple)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--runs-dir", type=Path, default=Path("runs"), help="the runs folder (default %(default)s)"
    )
    what = p.add_mutually_exclusive_group()
    what.add_argument("--show", metavar="ID", help="print one run's summary again")
    what.add_argument(
        "--compare",
        nargs=2,
        metavar=("ID1", "ID2"),
        help="two runs of one experiment side by side (default: list them all)",
    )


def plan(args: argparse.Namespace) -> RunsPlan:
    return RunsPlan(args.runs_dir, args.show, tuple(args.compare or ()))


def _compare(p: RunsPlan) -> list[str]:
    a, b = (find_run(p.runs_dir, run_id) for run_id in p.compare)
    if a.summary is None or b.summary is None:
        bad = a if a.summary is None else b
        raise ValueError(f"run {bad.run_id} cannot be compared: {bad.problem}")
    if a.summary.experiment != b.summary.experiment:
        raise ValueError(
            f"runs of different experiments: {a.run_id} is {a.summary.experiment}, "
            f"{b.run_id} is {b.summary.experiment}"
        )
    return compare_lines(a, b)


def run(p: RunsPlan) -> tuple[list[str], str]:
    """(lines to print, the error line: bad input, exit 2)."""
    try:
        if p.compare:
            return _compare(p), ""
        if p.show is not None:
            return show_lines(find_run(p.runs_dir, p.show)), ""
    except ValueError as e:
        return [], f"error: {e}"
    return list_lines(scan_runs(p.runs_dir), str(p.runs_dir)), ""


def report(result: tuple[list[str], str]) -> int:
    lines, error = result
    for line in lines:
        print(line)
    if error:
        print(error, file=sys.stderr)
        return 2
    return 0
