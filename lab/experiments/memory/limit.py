"""The memory limit of the second part: per node, halfway from the sharded run's
peak to DDP with Adam's, both as the engine measured them on that node; node 0 runs without
one. Pure.

Why not node 0: rank 0 also trains the single-process reference the parity verdict needs (its
own model and Adam state), and before every step it gathers the whole optimizer state to start
the reference from it, so it holds the whole state whether the run is sharded or not. Sharding
saves nothing there by design of the check, not of the sharding; the other nodes are where the
saving is, and where the limit is held.

Why halfway: a peak holds page cache (what the ranks read: Python's files, the data), which
the kernel evicts before it kills anyone once a limit is reached. Both runs hold about the
same, C, so a run needs at least its peak minus C. And the limited runs train the parity
reference, which the measured runs leave out (it would skew their bytes and times): every rank
then also sends its part of the optimizer state to rank 0 before each step, a transient the
measured sharded peak does not hold. Half the gap is room for that and for the run-to-run
noise of the peaks, and leaves DDP half the gap short. A gap too small to split is refused:
the model must grow, not the margin shrink.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = ["LIMIT_AT", "MIN_GAP_MIB", "REFERENCE_NODE", "choose_limits", "describe_limits"]

REFERENCE_NODE = 0  # rank 0's node: it trains the parity reference too, and runs unlimited

MIN_GAP_MIB = 48.0  # below this the two runs' peaks are within the noise of one another
LIMIT_AT = 0.5  # the limit's place from the sharded run's peak (0) to DDP's (1)


def choose_limits(
    ddp: Mapping[int, float | None],
    sharded: Mapping[int, float | None],
    override_mib: float | None = None,
) -> dict[int, float]:
    """Node -> limit in MiB (whole MiB) for every node but the reference's: ``override_mib``,
    else ``LIMIT_AT`` of the way from the node's sharded peak to its DDP peak. ValueError
    when a peak is missing, or DDP's is not above the sharded run's by ``MIN_GAP_MIB`` on
    every such node."""
    if set(ddp) != set(sharded):
        raise ValueError(f"the runs had different nodes: {sorted(ddp)} vs {sorted(sharded)}")
    nodes = sorted(n for n in ddp if n != REFERENCE_NODE)
    if not nodes:
        raise ValueError("no node but the reference's to hold to a limit: give --nodes >= 2")
    if override_mib is not None:
        return {n: float(round(override_mib)) for n in nodes}
    limits = {}
    for node in nodes:
        a, b = ddp[node], sharded[node]
        if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
            raise ValueError(
                f"node{node}'s peak memory was not reported by the engine (cgroup v2?): give "
                "--limit-mb"
            )
        if a - b < MIN_GAP_MIB:
            raise ValueError(
                f"node{node}: DDP+Adam peaked at {a:.0f} MiB and the sharded run at {b:.0f} "
                f"MiB, less than {MIN_GAP_MIB:g} MiB apart: too close to pick a limit between "
                "them; use a larger model or more --nodes"
            )
        limits[node] = float(round(b + LIMIT_AT * (a - b)))
    return limits


def describe_limits(limits: Mapping[int, float]) -> str:
    """``"640 MiB"`` when every limited node has one limit, else ``"620-660 MiB"``."""
    low, high = min(limits.values()), max(limits.values())
    return f"{low:.0f} MiB" if round(low) == round(high) else f"{low:.0f}-{high:.0f} MiB"
