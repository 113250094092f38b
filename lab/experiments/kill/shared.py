"""What the three paths of ``lab kill`` share: the words of their reports and live lines, and
the frame of the page that the restart path and torchrun fill in.

Apart from the paths (:mod:`.restart`, :mod:`.torchrun`, :mod:`.live`) because each of them
imports it, and the command (:mod:`lab.experiments.kill`) imports each of them. Not named
``common``: importing a submodule binds its name in the package, and the command's
``common`` is :mod:`lab.args`, as in every experiment.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from ddp.torchfree import Headline, Page, Section, error_meaning, strip_source
from lab.report.common import command_line, ranks_section
from lab.report.results import Results
from lab.report.summary import RunSummary, started_at

__all__ = ["fmt_s", "kill_page", "table", "tidy_line"]

# Words for the report and the live lines: gloo's errors by their meaning, one prefix per line,
# tables whose headings name their columns. Cosmetic only: nothing here decides anything
# (decisions come from records and exit events).

# ddp quotes the raw error at the end of its diagnosis line: "diagnosis: ... [<gloo's text>]"
_QUOTED = re.compile(r"\s\[(.+)\]$")
_RANK_PREFIX = re.compile(r"^(?:\[rank\d+\]\s*)+")  # ddp's own, once per logger and per error


def tidy_line(text: str) -> str:
    """A rank's output line for display under lab's own prefix: ddp's ``[rankN]`` prefixes and
    gloo's source paths dropped, a quoted raw error at the end of the line by its meaning."""
    text = strip_source(_RANK_PREFIX.sub("", text))
    quoted = _QUOTED.search(text)
    if quoted:
        meaning = error_meaning(quoted.group(1))
        if meaning != quoted.group(1).strip():  # a known error: say what it means
            text = f"{text[: quoted.start()]} ({meaning})"
    return text


def fmt_s(seconds: float | None) -> str:
    """``0.05 s``, ``30.0 s``; ``-`` when unknown (a killed peer is noticed in milliseconds:
    ``0.0 s`` would read as not measured)."""
    if seconds is None:
        return "-"
    return f"{seconds:.2f} s" if abs(seconds) < 1 else f"{seconds:.1f} s"


def table(headings: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Aligned columns, each as wide as its heading or its widest cell; numbers (cells that
    start with a digit, '-' or '+') right-aligned, text left-aligned."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headings)]
    numeric = [all(_is_number(r[i]) for r in rows) and bool(rows) for i in range(len(headings))]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(w) if n else c.ljust(w) for c, w, n in zip(cells, widths, numeric, strict=True)
        ]
        return (indent + "  ".join(parts)).rstrip()

    return [line(headings), *(line(r) for r in rows)]


def _is_number(cell: str) -> bool:
    return cell == "-" or bool(re.match(r"^[+-]?\d", cell))


# The frame of a ``lab kill`` page that the restart path and torchrun share: the headline, the
# experiment's own sections, then how every phase's ranks ended, and the run's summary.json
# fields. Each path builds its sections from its own summary.


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
