"""The link at one rate: every node's egress capped (tbf) and, with ``--ms``, every packet
delayed, verified by the probe (:func:`lab.shaping.link.shaped`: the delay on TCP echoes, the
rate on a TCP bulk transfer) for as long as the jobs at that rate run
(:func:`lab.shaping.verified_link.verified_link`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from lab.engine.cluster import Cluster
from lab.experiments.compress.plan import CompressPlan
from lab.experiments.compress.result import LinkInfo
from lab.shaping.verified_link import verified_link

__all__ = ["capped"]


@contextlib.contextmanager
def capped(
    cluster: Cluster, plan: CompressPlan, rate_mbit: float, max_seconds: float
) -> Iterator[LinkInfo]:
    """Shape every node at ``rate_mbit`` (and ``plan.ms``), yield what was measured, undo."""
    with verified_link(
        cluster,
        f"at {rate_mbit:g} Mbit/s",
        plan.ms,
        plan.shaper,
        rate_mbit,
        max_seconds=max_seconds,
    ) as rep:
        yield LinkInfo(
            rate_mbit,
            rep.shaper,
            rep.line(),
            rep.note,
            rep.bulk.get("mbit_s"),
            rep.measured.get("p50_ms"),
            rep.baseline.get("p50_ms"),
        )
