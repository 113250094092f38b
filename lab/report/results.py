"""What an experiment's page builder hands to :func:`lab.report.publish.publish`: the page,
the run's summary, the files to link (name, what it is) and the jobs whose logs and scalars
belong to the run."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ddp.torchfree import Page
from lab.report.summary import RunSummary

__all__ = ["Results", "ratio_text"]


@dataclass
class Results:
    page: Page
    summary: RunSummary
    files: list[tuple[str, str]] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)


def ratio_text(value: float | None) -> str:
    """``1.7x``; ``n/a`` for a ratio whose sides were not both measured."""
    return "n/a" if value is None or math.isnan(value) else f"{value:.1f}x"
