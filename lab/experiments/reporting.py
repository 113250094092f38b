"""What every sweep hands to its report, and what the report does around its own table.

The result: the run's id and directory, the verified link of every setting, every job's run,
how long it took. The report: write the figures from the collected logs (or say, without a
traceback, why the logs cannot give them, and where they are), print the experiment's table,
one line of how long the run took and which files it wrote, what broke, and the exit code;
then the run's page, summary and scalars (:mod:`lab.report`). Docker-free, so reports and
their tests build on it without the engine.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from lab.report.guard import report_failure
from lab.report.publish import publish
from lab.report.results import Results

__all__ = ["Closing", "SweepResult", "report_sweep", "written", "wrote_line"]

Out = TypeVar("Out")
PlanT = TypeVar("PlanT")
LinkT = TypeVar("LinkT")
RunT = TypeVar("RunT")


class _Job(Protocol):
    job: str  # the job's name: its directory in the run


@dataclass
class SweepResult(Generic[PlanT, LinkT, RunT]):
    """A sweep's run: the verified link of every setting and every job, in run order."""

    plan: PlanT
    run_id: str
    run_dir: Path
    links: list[LinkT] = field(default_factory=list)
    runs: list[RunT] = field(default_factory=list)
    seconds: float = 0.0

    def log_dir(self, run: _Job) -> Path:
        """Where the cluster collected ``run``'s rank logs."""
        return self.run_dir / run.job / "logs"


@dataclass(frozen=True)
class Closing:
    """An experiment's lines around the report's 'took' line; ``broken`` (what broke, e.g.
    "parity BROKEN in: ...") makes the exit code 1."""

    table: list[str]  # before the 'took' line
    broken: str = ""
    after: list[str] = field(default_factory=list)


def written(write_outputs: Callable[[Any], Out], result: Any) -> Out | None:
    """``write_outputs(result)``, or None after printing why it failed (a ValueError, LogError
    included: the logs cannot give the figures); the caller then exits 1."""
    return _written(write_outputs, result)[0]


def _written(write_outputs: Callable[[Any], Out], result: Any) -> tuple[Out | None, str]:
    try:
        return write_outputs(result), ""
    except ValueError as e:
        print(f"error: {e} (the logs are in {result.run_dir}/)", file=sys.stderr)
        return None, str(e)


def wrote_line(result: Any, files: Sequence[Path], took: str = "took") -> str:
    names = ", ".join(f.name for f in files)
    return f"{took} {result.seconds:.0f} s; wrote {result.run_dir}/: {names}"


def report_sweep(
    result: Any,
    write_outputs: Callable[[Any], Out],
    closing: Callable[[Any, Out], Closing],
    took: str = "took",
    *,
    results: Callable[[Any, Out, str], Results] | None = None,
    name: str = "",
) -> int:
    """Write the files, print the experiment's lines around the 'took' line; exit 1 when the
    logs cannot give the figures or something broke, else 0. With ``results`` (the
    experiment's page builder, given the outputs and what broke) also ``report.html``,
    ``summary.json`` and the scalars; when the logs cannot give the figures, the failure page
    of experiment ``name`` instead."""
    out, why = _written(write_outputs, result)
    if out is None:
        if name:
            report_failure(
                name, result.run_dir, f"the logs cannot give the figures: {why}", result.seconds
            )
        return 1
    lines = closing(result, out)
    for line in lines.table:
        print(line)
    print(wrote_line(result, out.files, took))  # type: ignore[attr-defined]
    if results is not None:  # before what broke and the headline: those stay the last lines
        made = results(result, out, lines.broken)
        for line in publish(result.run_dir, made.page, made.summary, made.files, made.jobs):
            print(line)
    if lines.broken:
        print(lines.broken)
    for line in lines.after:
        print(line)
    return 1 if lines.broken else 0
