"""What an experiment's page builder hands to :func:`lab.report.publish.publish`: the page,
the run's summary, the files to link (name, what it is) and the jobs whose logs and scalars
belong to the run."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ddp.torchfree import Headline, Page, Section
from lab.report.common import command_line
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
    problems: list[str],
    headline: tuple[str, str, bool],
    configs: dict[str, float],
    files: Sequence[tuple[str, str]],
    jobs: Sequence[str],
) -> Results:
    """The page and the summary of a sweep's run, from its sections and its headline
    (verdict, key figure, ok): both say the same command, verdict and figure."""
    verdict, figure, ok = headline
    command = command_line(name)
    page = Page(
        f"lab {name}: run {result.run_id}",
        Headline(command, verdict, figure, ok),
        list(sections),
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
    return Results(page, summary, list(files), list(jobs))
