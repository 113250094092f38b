"""The sweep's link at one delay: the cluster's nodes shaped and verified
(:func:`lab.shaping.verified_link.verified_link`) for as long as the configurations at that
delay run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from lab.engine.cluster import Cluster
from lab.experiments.latency.plan import LatencyPlan
from lab.experiments.latency.result import LinkReport
from lab.shaping.verified_link import verified_link

__all__ = ["link"]


@contextlib.contextmanager
def link(
    cluster: Cluster, plan: LatencyPlan, ms: float, max_seconds: float
) -> Iterator[LinkReport]:
    """Shape the cluster's links at ``ms`` (and ``plan.rate_mbit``), yield what was measured,
    undo on the way out. ``max_seconds`` bounds the processes the shaping leaves in the nodes."""
    if ms == 0 and not (plan.rate_mbit or plan.impair or plan.node_ms):
        yield LinkReport(ms, "none", line="link unshaped (--ms 0): the bridge's own latency")
        return
    with verified_link(cluster, f"at {ms:g} ms", ms, plan.shaper, plan.rate_mbit,
                       max_seconds=max_seconds, node_ms=dict(plan.node_ms),
                       impair=plan.impair) as rep:  # fmt: skip
        yield LinkReport(
            ms, rep.shaper, rep.note, rep.line(), rep.measured.get("p50_ms"),
            rep.measured.get("p90_ms"), rep.baseline.get("p50_ms"),
        )  # fmt: skip
