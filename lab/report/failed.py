"""The page of a run that failed before its report could judge it: the engine failed, a
phase timed out, the logs cannot give the figures, or Ctrl-C.

It says why at the top, then what the collected logs still tell: each rank's failure record
(ddp's diagnosis, e.g. "rank 2 missing at step 5"), ddp's diagnosis over the flight
recorder's dumps where the ranks left them, how each rank ended, the figures written so far.
"""

from __future__ import annotations

from pathlib import Path

from ddp.torchfree import Headline, LogError, Page, Section, Text, diagnose, load_dumps
from lab.report.common import command_line, job_logs, ranks_section
from lab.report.summary import RunSummary, started_at

__all__ = ["failed_jobs", "failure_report", "key_figure"]


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
