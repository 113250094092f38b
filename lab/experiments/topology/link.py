"""The link between the nodes: every node's eth0 delayed (``--ms``) and, with ``--rate-mbit``,
capped, verified by the probe (:func:`lab.shaping.verified_link.verified_link`) for as long as
the jobs run. Ranks of one node talk over loopback, which no shaper touches."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from lab.engine.cluster import Cluster
from lab.experiments.topology.plan import TopologyPlan
from lab.experiments.topology.result import LinkInfo
from lab.shaping.verified_link import verified_link

__all__ = ["between_nodes"]


@contextlib.contextmanager
def between_nodes(
    cluster: Cluster, plan: TopologyPlan, setting: object, max_seconds: float
) -> Iterator[LinkInfo]:
    """Shape, verify, yield what the probe measured, undo (``setting``: the sweep's only one)."""
    where = "between the nodes"
    kw = {"max_seconds": max_seconds}
    with verified_link(cluster, where, plan.ms, plan.shaper, plan.rate_mbit, **kw) as rep:
        yield LinkInfo.from_report(rep)
