"""When to re-measure the link: a change detector on a series of communication times.

A plan is only as good as the link it was chosen for. Re-measuring every few steps would cost
probe time on a link that never changes, so the automatic setting watches its own steps: once
a plan has settled, the times it measured form a baseline, and a later window whose median
moves away from it by more than a relative and an absolute margin (both: a 1 ms step may
double by noise, a 100 ms one not by 30 ms) says the link changed. Medians, so one slow step
(a page fault, a neighbour's burst on a shared host) never triggers a re-measure. Pure: rank 0
runs it on its own series and broadcasts the verdict, so every rank re-plans at the same step.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

__all__ = ["ABSOLUTE_S", "RELATIVE", "link_changed"]

# A change is a median at least twice the baseline's, or below half of it. On a host whose
# cores other jobs share, a settled plan's window median wandered up to 1.95x (4 ranks, load
# 34); a link that gains 5 ms and loses its bandwidth moves it tenfold.
RELATIVE = 1.0
ABSOLUTE_S = 0.005  # ...and at least 5 ms away from it


def link_changed(
    baseline: Sequence[float],
    recent: Sequence[float],
    *,
    relative: float = RELATIVE,
    absolute_s: float = ABSOLUTE_S,
) -> bool:
    """Whether ``recent`` (seconds, the last few steps) no longer looks like ``baseline`` (the
    settled steps of the plan in force): its median is ``1 + relative`` times larger or smaller
    and at least ``absolute_s`` away. Empty series decide nothing."""
    if not baseline or not recent:
        return False
    base, now = statistics.median(baseline), statistics.median(recent)
    if abs(now - base) < absolute_s:
        return False
    return now > base * (1 + relative) or now * (1 + relative) < base
