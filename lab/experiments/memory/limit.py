"""The memory limit of the second part: per node, halfway between the sharded run's peak and
DDP with Adam's, both as the engine measured them on that node. Pure.

Why per node and halfway: rank 0 also trains the single-process reference the parity verdict
needs (its own model and Adam state), so node 0's peaks sit above the others' by that much in
both runs; what sharding saves is the gap between the two runs on the same node. Halfway
leaves DDP half the gap too little and the sharded run half the gap to spare, so noise smaller
than half the gap (page cache, the allocator) cannot decide the outcome. A gap too small to
split is refused: the model must grow, not the margin shrink.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = ["MIN_GAP_MIB", "choose_limits", "describe_limits"]

MIN_GAP_MIB = 48.0  # below this the two runs' peaks are within the noise of one another


def choose_limits(
    ddp: Mapping[int, float | None],
    sharded: Mapping[int, float | None],
    override_mib: float | None = None,
) -> dict[int, float]:
    """Node -> limit in MiB (whole MiB): ``override_mib`` on every node, else halfway between
    the node's two peaks. ValueError when a peak is missing, or DDP's is not above the sharded
    run's by ``MIN_GAP_MIB`` on every node."""
    if set(ddp) != set(sharded) or not ddp:
        raise ValueError(f"the runs had different nodes: {sorted(ddp)} vs {sorted(sharded)}")
    if override_mib is not None:
        return {n: float(round(override_mib)) for n in sorted(ddp)}
    limits = {}
    for node in sorted(ddp):
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
        limits[node] = float(round((a + b) / 2))
    return limits


def describe_limits(limits: Mapping[int, float]) -> str:
    """``"640 MiB"`` when every node has one limit; else the others' and node 0's (which runs
    the reference): ``"640 MiB per node (node0, with the parity reference: 1100 MiB)"``."""
    values = sorted(set(limits.values()))
    if len(values) == 1:
        return f"{values[0]:.0f} MiB"
    others = [v for n, v in limits.items() if n != 0]
    low, high = min(others), max(others)
    span = f"{low:.0f}" if low == high else f"{low:.0f}-{high:.0f}"
    return f"{span} MiB per node (node0, with the parity reference: {limits[0]:.0f} MiB)"
