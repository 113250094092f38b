"""Words for the report and the live lines: gloo's errors by their meaning, one prefix per line,
tables whose headings name their columns.

Cosmetic only: nothing here decides anything (decisions come from records and exit events).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["error_meaning", "fmt_s", "table", "tidy_line"]

# gloo prefixes its errors with its source location: "[/__w/.../gloo/transport/tcp/pair.cc:553] "
_SOURCE = re.compile(r"\[[\w./-]*\.(?:cc|cpp|c|h|hpp):\d+\]\s*")
# ddp quotes the raw error at the end of its diagnosis line: "diagnosis: ... [<gloo's text>]"
_QUOTED = re.compile(r"\s\[(.+)\]$")
_RANK_PREFIX = re.compile(r"^(?:\[rank\d+\]\s*)+")  # ddp's own, once per logger and per error
_PEER = re.compile(r"\[?(\d{1,3}(?:\.\d{1,3}){3})\]?:(\d+)")
# What each raw error means for the rank that got it, most specific first.
_MEANINGS = (
    ("connection closed by peer", "the peer{at} closed the connection"),
    ("connection reset", "the connection was reset by the peer{at}"),
    ("connection refused", "the peer{at} refused the connection"),
    ("broken pipe", "the peer{at} closed the connection"),
    ("timed out", "timed out waiting for the peers"),
    ("timeout", "timed out waiting for the peers"),
)


def error_meaning(error: str | None) -> str:
    """A collective's raw error (gloo's text) as what it means, with the peer's address when
    gloo names one: ``the peer at 172.18.0.4:41234 closed the connection``. Unknown errors are
    quoted whole (first line), without gloo's source paths and never cut mid-sentence."""
    if not error or not error.strip():
        return ""
    text = _SOURCE.sub("", error.strip().splitlines()[0]).strip()
    lowered = text.lower()
    for needle, meaning in _MEANINGS:
        if needle in lowered:
            peer = _PEER.search(text)
            return meaning.format(at=f" at {peer.group(1)}:{peer.group(2)}" if peer else "")
    return text


def tidy_line(text: str) -> str:
    """A rank's output line for display under lab's own prefix: ddp's ``[rankN]`` prefixes and
    gloo's source paths dropped, a quoted raw error at the end of the line by its meaning."""
    text = _SOURCE.sub("", _RANK_PREFIX.sub("", text))
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
