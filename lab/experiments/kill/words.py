"""Words for the report and the live lines: gloo's errors by their meaning, one prefix per line,
tables whose headings name their columns.

Cosmetic only: nothing here decides anything (decisions come from records and exit events).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ddp.torchfree import error_meaning, strip_source

__all__ = ["error_meaning", "fmt_s", "table", "tidy_line"]

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
