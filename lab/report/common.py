"""The parts every experiment's page shares: the command line, each job's ranks read from
their collected logs, the figures and files of the run folder, and one number per job (its
median step time) for the runs list.

Read from the typed records (``ddp.torchfree.load_run``); a job whose logs cannot be read
shows why on the page instead of stopping the report.
"""

from __future__ import annotations

import shlex
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ddp.torchfree import Figure, LogError, RankLog, Section, Table, load_run, rank_exits

__all__ = [
    "command_line",
    "figures_section",
    "job_logs",
    "median_step_ms",
    "ranks_section",
]


def command_line(name: str) -> str:
    """The command as typed (``python -m lab ...``), or the experiment's name when the report
    was not reached from the command line (a test calling ``report()``)."""
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    if argv0.name == "lab" or (argv0.name == "__main__.py" and argv0.parent.name == "lab"):
        return shlex.join(["python", "-m", "lab", *sys.argv[1:]])
    return f"python -m lab {name}"


def job_logs(run_dir: Path, job: str) -> tuple[dict[int, RankLog], str]:
    """A job's collected rank logs, and what is wrong with them ("" when nothing)."""
    where = Path(run_dir) / job / "logs"
    try:
        logs = load_run(where)
    except (LogError, OSError) as e:
        return {}, f"{job}: the rank logs cannot be read ({e})"
    if not logs:
        return {}, f"{job}: no rank logs collected in {job}/logs/"
    torn = [r for r, log in logs.items() if log.torn]
    return logs, f"{job}: last line torn in rank {torn} (stopped mid-write)" if torn else ""


def median_step_ms(logs: Mapping[int, RankLog], warmup: int = 0) -> float | None:
    """The median over steps (after ``warmup``) of the slowest rank's step time."""
    by_step: dict[int, float] = {}
    for log in logs.values():
        for r in log.steps:
            if r.step > warmup:
                by_step[r.step] = max(r.step_ms, by_step.get(r.step, r.step_ms))
    return statistics.median(by_step.values()) if by_step else None


def ranks_section(
    run_dir: Path, jobs: Mapping[str, Mapping[int, int]], problems: list[str]
) -> Section:
    """Each job's ranks: steps logged, exit code, how each ended (its failure's diagnosis,
    its end record). Problems reading the logs go to ``problems``."""
    tables = []
    for job, codes in jobs.items():
        logs, problem = job_logs(run_dir, job)
        if problem:
            problems.append(problem)
        table = rank_exits(logs, codes)
        tables.append(Table(table.headers, table.rows, f"job {job}"))
    return Section("How each rank ended", tables)


def figures_section(run_dir: Path, names: Sequence[tuple[str, str]]) -> Section:
    """The PNGs the experiment wrote (name, caption); a missing one is said so on the page."""
    return Section("Figures", [Figure(Path(run_dir) / name, caption) for name, caption in names])
