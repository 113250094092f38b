"""The lab's own moments on a run's timeline: what it did to the run (a fault, a
replacement started), on the host's wall clock, merged with the ranks' records into one
timeline. Shared by every live path (``lab kill --recovery live``, ``lab run --recovery
live``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Moment", "first_moment"]


@dataclass(frozen=True)
class Moment:
    """Something the lab did, on the host's wall clock: ``kind`` "fault" or "replacement"."""

    t: float
    text: str
    kind: str


def first_moment(moments: Iterable[Moment], kind: str) -> Moment | None:
    """The first moment of ``kind``, or None when the lab never did it."""
    return next((m for m in moments if m.kind == kind), None)
