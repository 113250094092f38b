"""What a job's follower yields: typed events, parsed from the node launchers' lines.

One parser for the whole lab: a line is the launcher's own (``rank`` None), a rank's output,
a ddp record that rank wrote (``@ddp {json}``: progress, verdicts, failures, end) or the rank's
exit record. Consumers react to records and exits, never to the wording of a human line.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddp.torchfree import Record, parse_record_line
from lab.node.protocol import parse_exit, parse_line

__all__ = ["Event", "ExitEvent", "LineEvent", "RecordEvent", "parse_event"]


@dataclass(frozen=True)
class LineEvent:
    """A human-readable line (shown to the user, never interpreted)."""

    t: float  # host time.time() when it arrived
    node: int
    rank: int | None  # None: the launcher's own line, or unprefixed output
    text: str


@dataclass(frozen=True)
class RecordEvent:
    """A record a rank wrote (see :mod:`ddp.program.records`)."""

    t: float
    node: int
    rank: int
    record: Record


@dataclass(frozen=True)
class ExitEvent:
    """A rank ended. ``cpu_s``/``peak_rss_mib`` come from the launcher's rusage; they are None
    when the rank died with its container (then ``code`` is the container's, e.g. 137)."""

    t: float
    node: int
    rank: int
    code: int
    cpu_s: float | None = None
    peak_rss_mib: float | None = None


Event = LineEvent | RecordEvent | ExitEvent


def parse_event(t: float, node: int, line: str) -> Event:
    """One raw line of ``node``'s launcher as an event."""
    line_node, rank, body = parse_line(line)
    if line_node is None or rank is None:
        return LineEvent(t, node, None, body)
    exited = parse_exit(body)
    if exited is not None:
        return ExitEvent(t, node, rank, exited.code, exited.cpu_s, exited.peak_rss_mib)
    record = parse_record_line(body)
    if record is not None:
        return RecordEvent(t, node, rank, record)
    return LineEvent(t, node, rank, body)
