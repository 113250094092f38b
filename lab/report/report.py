"""What every sweep hands to its report, and the one direction its report flows in.

The result: the run's id and directory, the verified link of every setting, every job's run,
how long it took. The report: ``analyse(result)`` turns it into the experiment's summary (or a
``ValueError`` saying why the collected logs cannot give the figures); then the files, the
console text and the page are each built from that summary alone, none from what another of
them returned. :func:`report_sweep` prints the experiment's table, one line of how long the run
took and which files it wrote, the page's line, what broke, the closing lines, and returns the
exit code. Docker-free, so reports and their tests build on it without the engine.

:func:`report` is the one way an experiment reports: analyse -> files -> console -> page ->
``lab runs`` entry -> exit code. :func:`plan_settings` is the settings every experiment's JSON
file carries (the plan, JSON-safe), so the settings file is the same shape everywhere.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from lab.report.failed import report_failure
from lab.report.publish import publish
from lab.report.results import Results

__all__ = ["Closing", "Judged", "SweepResult", "plan_settings", "report", "wrote_line"]

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


class Judged(Protocol):
    """What :func:`report_sweep` needs of an experiment's summary: the run it was made from,
    and what broke (e.g. "parity BROKEN in: ..."; "" when nothing did)."""

    @property
    def result(self) -> Any: ...

    @property
    def broken(self) -> str: ...


R = TypeVar("R")
S = TypeVar("S", bound=Judged)


@dataclass(frozen=True)
class Closing:
    """An experiment's console lines: ``table`` before the 'took' line, ``after`` after what
    broke (the headline last)."""

    table: list[str]
    after: list[str] = field(default_factory=list)


def plan_settings(plan: Any, *, skip: Sequence[str] = (), **extra: Any) -> dict[str, Any]:
    """The plan's fields for the JSON settings file: paths as text, nested dataclasses as
    dicts, a ``TrainConfig`` through its own ``to_dict``; fields in ``skip`` left out, then
    ``extra`` (derived settings, e.g. the CPU quota) added in order."""

    def safe(v: Any) -> Any:
        if isinstance(v, Path):
            return str(v)
        if hasattr(v, "to_dict"):
            return v.to_dict()
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return dataclasses.asdict(v)
        return v

    out = {f.name: safe(getattr(plan, f.name)) for f in dataclasses.fields(plan)}
    for name in skip:
        out.pop(name, None)
    return out | {k: safe(v) for k, v in extra.items()}


def wrote_line(result: Any, files: Sequence[Path], took: str = "took") -> str:
    names = ", ".join(f.name for f in files)
    return f"{took} {result.seconds:.0f} s; wrote {result.run_dir}/: {names}"


def report(
    result: R,
    analyse: Callable[[R], S],
    *,
    files: Callable[[S], Sequence[Path]],
    console: Callable[[S], Closing],
    page: Callable[[S], Results],
    name: str,
    took: str = "took",
) -> int:
    """Analyse ``result``, write its files, print its console lines and publish its page
    (``report.html``, ``summary.json``, the scalars); exit 1 when something broke, else 0.
    When the logs cannot give the figures: one error line, the failure page of experiment
    ``name``, exit 1."""
    run_dir, seconds = result.run_dir, result.seconds  # type: ignore[attr-defined]
    try:
        summary = analyse(result)
        written = files(summary)
    except ValueError as e:
        print(f"error: {e} (the logs are in {run_dir}/)", file=sys.stderr)
        report_failure(name, run_dir, f"the logs cannot give the figures: {e}", seconds)
        return 1
    lines = console(summary)
    for line in lines.table:
        print(line)
    print(wrote_line(result, written, took))
    made = page(summary)  # before what broke and the headline: those stay the last lines
    for line in publish(run_dir, made.page, made.summary, made.files, made.jobs):
        print(line)
    if summary.broken:
        print(summary.broken)
    for line in lines.after:
        print(line)
    return 1 if summary.broken else 0
