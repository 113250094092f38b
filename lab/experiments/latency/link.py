"""The sweep's link at one delay: the cluster's nodes shaped and verified
(:func:`lab.shaping.link.shaped`) for as long as the configurations at that delay run.

A shaping failure becomes a :class:`~lab.engine.client.LabError` the CLI prints: a link that is
not what was asked means nothing was measured.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from lab.engine.client import LabError
from lab.engine.cluster import Cluster
from lab.experiments.latency.plan import LatencyPlan
from lab.experiments.latency.result import LinkReport
from lab.shaping.base import LinkMismatch, ShapingError, nodes_of
from lab.shaping.link import shaped

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
    entered = False
    try:
        with shaped(nodes_of(cluster), ms, plan.shaper, plan.rate_mbit, max_seconds=max_seconds,
                    node_ms=dict(plan.node_ms), impair=plan.impair) as rep:  # fmt: skip
            entered = True
            yield LinkReport(
                ms, rep.shaper, rep.note, rep.line(), rep.measured.get("p50_ms"),
                rep.measured.get("p90_ms"), rep.baseline.get("p50_ms"),
            )  # fmt: skip
    except LinkMismatch as e:
        raise LabError(f"link check failed at {ms:g} ms, nothing was measured: {e}") from None
    except ShapingError as e:
        # Undoing can fail after the sweep ran (entered): the nodes are removed anyway.
        when = "undoing the shaping" if entered else "shaping the link"
        raise LabError(f"{when} at {ms:g} ms failed: {e}") from None
