"""The page of a run that failed before its report could judge it: the engine failed, a
phase timed out, the logs cannot give the figures, or Ctrl-C. A run that raises never reaches
its experiment's report: :func:`guarded` writes this page for it on the way out, then lets the
error go on to the command line.

It says why at the top, then what the collected logs still tell: each rank's failure record
(ddp's diagnosis, e.g. "rank 2 missing at step 5"), ddp's diagnosis over the flight
recorder's dumps where the ranks left them, how each rank ended, the figures written so far.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ddp.torchfree import Headline, LogError, Page, Section, Text, diagnose, load_dumps
from lab.report.common import command_line, job_logs, ranks_section
from lab.report.publish import publish
from lab.report.summary import RunSummary, started_at

__all__ = ["failed_jobs", "failure_report", "guarded", "key_figure", "report_failure"]

R = TypeVar("R")


def failed_jobs(run_dir: Path) -> list[str]:
    """Every job folder of the run that holds collected logs, in name order."""
    run_dir = Path(run_dir)
    return sorted(p.parent.name for p in run_dir.glob("*/logs") if p.is_dir())


def key_figure(diagnosis: str) -> str:
    """The headline's part of a diagnosis line: ``rank 2 missing at step 5``."""
    return diagnosis.removeprefix("diagnosis: ").split(" (")[0].split(";")[0]


def _diagnoses(run_dir: Path, jobs: list[str]) -> list[tuple[str, str]]:
    """(where, what): each rank's failure record, then ddp's diagnosis over each job's flight
    dumps."""
    found = []
    for job in jobs:
        logs, _ = job_logs(run_dir, job)
        found += [
            (f"{job}, rank {r}", log.failure.message)
            for r, log in sorted(logs.items())
            if log.failure
        ]
        try:
            dumps = load_dumps(Path(run_dir) / job / "logs" / "flight")
        except (OSError, ValueError, LogError):
            dumps = {}
        world = max([*logs, *dumps], default=-1) + 1
        configs = [log.config for log in logs.values() if log.config is not None]
        world = max([world, *(c.world_size for c in configs)])
        diag = diagnose(dumps, world) if dumps and world else None
        if diag is not None and diag.stuck_seq is not None:
            found.append((f"{job}, flight recorder", diag.summary()))
    return found


def failure_report(
    name: str, run_id: str, run_dir: Path, error: str, seconds: float = 0.0
) -> tuple[Page, RunSummary, list[str]]:
    """The page, the summary (ok False) and the jobs whose logs were collected."""
    jobs = failed_jobs(run_dir)
    found = _diagnoses(run_dir, jobs)
    figure = key_figure(found[-1][1]) if found else ""
    command = command_line(name)
    problems: list[str] = []
    sections = [Section("Why it failed", [Text([error], pre=True)])]
    if found:
        sections.append(Section("Diagnosis", [Text([f"{w}: {t}" for w, t in found], pre=True)]))
    sections.append(ranks_section(run_dir, {job: {} for job in jobs}, problems))
    page = Page(
        f"lab {name}: run {run_id}",
        Headline(command, f"failed: {error}", figure, False),
        sections,
        problems=problems,
    )
    summary = RunSummary(
        name, run_id, command, started_at(seconds), seconds, figure, f"failed: {error}", False
    )
    return page, summary, jobs


def report_failure(name: str, run_dir: Path, error: str, seconds: float = 0.0) -> None:
    """Write the failure page of the run in ``run_dir`` and print where it is."""
    page, summary, jobs = failure_report(name, run_dir.name, run_dir, error, seconds)
    for line in publish(run_dir, page, summary, jobs=jobs):
        print(line, file=sys.stderr)


def _why(e: BaseException) -> str:
    if isinstance(e, KeyboardInterrupt):
        return "interrupted (Ctrl-C)"
    return f"{e}" if type(e).__name__ == "LabError" else f"{type(e).__name__}: {e}"


def guarded(name: str, run: Callable[[Any], R]) -> Callable[[Any], R]:
    """``run`` that, when it raises after a cluster started, first writes that run's page."""
    from lab.engine import cluster

    def guarded_run(plan: Any) -> R:
        before, t0 = len(cluster.STARTED), time.monotonic()
        try:
            return run(plan)
        except (Exception, KeyboardInterrupt) as e:
            for run_id in cluster.STARTED[before:]:
                run_dir = Path(plan.runs_dir) / run_id
                try:
                    report_failure(name, run_dir, _why(e), time.monotonic() - t0)
                except Exception as inner:  # the original error matters more
                    print(f"warning: no report for {run_dir}: {inner}", file=sys.stderr)
            raise

    return guarded_run
