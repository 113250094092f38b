"""The frame of a ``lab kill`` page that the restart path and torchrun share: the headline, the
experiment's own sections, then how every phase's ranks ended, and the run's summary.json
fields. Each path's ``page.py`` builds its sections from its own summary."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from ddp.torchfree import Headline, Page, Section
from lab.report.common import command_line, ranks_section
from lab.report.results import Results
from lab.report.summary import RunSummary, started_at

__all__ = ["kill_page"]


def kill_page(
    run: tuple[str, Path, float],
    sections: Sequence[Section],
    phases: Mapping[str, Mapping[int, int]],
    headline: tuple[str, str, bool],
    files: Sequence[tuple[str, str]],
) -> Results:
    """``run``: (id, directory, seconds); ``phases``: each job's exit codes by rank;
    ``headline``: (verdict, key figure, ok); ``files``: the run's files to link."""
    run_id, run_dir, seconds = run
    verdict, figure, ok = headline
    command = command_line("kill")
    problems: list[str] = []
    codes = {name: dict(c) for name, c in phases.items()}
    page = Page(
        f"lab kill: run {run_id}",
        Headline(command, verdict, figure, ok),
        [*sections, ranks_section(run_dir, codes, problems)],
        problems=problems,
    )
    summary = RunSummary("kill", run_id, command, started_at(seconds), seconds, figure, verdict, ok)
    return Results(page, summary, list(files), list(codes))
