"""What an experiment's page builder hands to :func:`lab.report.publish.publish`: the page,
the run's summary, the files to link (name, what it is) and the jobs whose logs and scalars
belong to the run."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ddp.torchfree import Headline, Page, Section
from lab.report.common import command_line, ranks_section
from lab.report.summary import RunSummary, started_at

__all__ = ["Results", "ratio_text", "sweep_results"]


@dataclass
class Results:
    page: Page
    summary: RunSummary
    files: list[tuple[str, str]] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)


def ratio_text(value: float | None) -> str:
    """``1.7x``; ``n/a`` for a ratio whose sides were not both measured."""
    return "n/a" if value is None or math.isnan(value) else f"{value:.1f}x"


def sweep_results(
    name: str,
    result: Any,
    sections: Sequence[Section],
    ranks: Mapping[str, Mapping[int, int]],
    headline: tuple[str, str, str],
    configs: dict[str, float],
    files: Sequence[tuple[str, str]],
    jobs: Sequence[str] | None = None,
) -> Results:
    """The page and the summary of a sweep's run, from its sections, each job's exit codes
    (``ranks``: how each rank ended closes the page) and its headline (what broke, "" when
    nothing did; the verdict when nothing did; the key figure): both say the same command,
    verdict and figure. ``jobs``, those whose logs belong to the run: ``ranks``' by default."""
    broken, held, figure = headline
    verdict, ok = broken or held, not broken
    problems: list[str] = []
    sections = [*sections, ranks_section(result.run_dir, ranks, problems)]
    command = command_line(name)
    page = Page(
        f"lab {name}: run {result.run_id}",
        Headline(command, verdict, figure, ok),
        sections,
        problems=problems,
    )
    summary = RunSummary(
        name,
        result.run_id,
        command,
        started_at(result.seconds),
        result.seconds,
        figure,
        verdict,
        ok,
        configs,
    )
    return Results(page, summary, list(files), list(ranks if jobs is None else jobs))
