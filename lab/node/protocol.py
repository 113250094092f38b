"""The line protocol between a node's launcher and the host: one parser on each side.

Every line a node's launcher writes is ``[node<N>/rank<R>] <body>`` for a rank's output or
``[node<N>] <body>`` for the launcher's own. A rank's last line is its exit record,
``[node<N>/rank<R>] @lab-exit {"code": 0, "cpu_s": 2.31, "peak_rss_mib": 307}``. What a body
means beyond that (e.g. ddp's ``@ddp`` records) is the host's business. Standard library only.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass

__all__ = ["EXIT_PREFIX", "ExitRecord", "format_line", "parse_exit", "parse_line"]

EXIT_PREFIX = "@lab-exit "
_LINE = re.compile(r"^\[node(\d+)(?:/rank(\d+))?\] ?(.*)$")


@dataclass(frozen=True)
class ExitRecord:
    """How one rank's process ended: its exit code and its own rusage."""

    code: int
    cpu_s: float | None = None
    peak_rss_mib: float | None = None

    def body(self) -> str:
        return EXIT_PREFIX + json.dumps(asdict(self))


def format_line(node: int, rank: int | None, body: str) -> str:
    return f"[node{node}{'' if rank is None else f'/rank{rank}'}] {body}"


def parse_line(line: str) -> tuple[int | None, int | None, str]:
    """``"[node1/rank2] text"`` -> ``(1, 2, "text")``; anything else -> ``(None, None, line)``."""
    m = _LINE.match(line)
    if not m:
        return None, None, line
    return int(m.group(1)), (int(m.group(2)) if m.group(2) else None), m.group(3)


def parse_exit(body: str) -> ExitRecord | None:
    """The exit record in a line's body, else None."""
    if not body.startswith(EXIT_PREFIX):
        return None
    try:
        data = json.loads(body[len(EXIT_PREFIX) :])
        return ExitRecord(int(data["code"]), data.get("cpu_s"), data.get("peak_rss_mib"))
    except (ValueError, KeyError, TypeError):
        return None  # cut short: the host falls back to the container's state
