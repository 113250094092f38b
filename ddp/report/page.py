"""What a results page holds, as plain data: a headline, sections of blocks, links.

A program fills a :class:`Page` from its own typed results (records, result objects), never
from the text it printed, and :mod:`ddp.report.html` renders it. Torch-free, so the lab builds
its reports from it through ``ddp.torchfree``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Block", "Figure", "Headline", "Link", "Page", "Section", "Table", "Text"]


@dataclass(frozen=True)
class Headline:
    """The top of the page: what was run, how it ended, and the one figure that matters.
    ``ok`` colours the verdict (None: neither a pass nor a failure, e.g. a measurement)."""

    command: str
    verdict: str
    figure: str = ""
    ok: bool | None = None


@dataclass(frozen=True)
class Table:
    headers: Sequence[str]
    rows: Sequence[Sequence[object]]
    caption: str = ""


@dataclass(frozen=True)
class Figure:
    """A PNG the run wrote, embedded in the page (a missing or unreadable file is said so on
    the page instead of a broken image)."""

    path: Path
    caption: str = ""


@dataclass(frozen=True)
class Text:
    """Lines of text; ``pre`` keeps them monospaced and aligned (a timeline, a diagnosis)."""

    lines: Sequence[str]
    pre: bool = False


Block = Table | Figure | Text


@dataclass(frozen=True)
class Section:
    title: str
    blocks: Sequence[Block] = ()


@dataclass(frozen=True)
class Link:
    """A file of the run, relative to the page's folder; ``note`` says what it is."""

    href: str
    note: str = ""


@dataclass
class Page:
    title: str
    headline: Headline
    sections: list[Section] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # shown under the headline
