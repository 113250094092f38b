"""The sweep's link of one phase (a delay and a rate cap): the cluster's nodes shaped and
verified (:func:`lab.shaping.verified_link.verified_link`) for as long as the phase's
configurations run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from lab.engine.cluster import Cluster
from lab.experiments.latency.plan import LatencyPlan, Phase
from lab.experiments.latency.result import LinkReport
from lab.shaping.verified_link import verified_link

__all__ = ["link"]


@contextlib.contextmanager
def link(
    cluster: Cluster, plan: LatencyPlan, phase: Phase, max_seconds: float
) -> Iterator[LinkReport]:
    """Shape the cluster's links at the phase's delay and rate cap, yield what was measured
    (its note led by the phase's intro), undo on the way out. ``max_seconds`` bounds the
    processes the shaping leaves in the nodes."""
    ms, rate = phase.ms, phase.rate_mbit
    if ms == 0 and not (rate or plan.impair or plan.node_ms):
        line = "link unshaped (--ms 0): the bridge's own latency"
        yield LinkReport(ms, "none", phase.intro, line, phase=phase.key)
        return
    where = f"at {ms:g} ms" + (f" ({phase.title} phase)" if phase.key else "")
    with verified_link(
        cluster,
        where,
        ms,
        plan.shaper,
        rate,
        max_seconds=max_seconds,
        node_ms=dict(plan.node_ms),
        impair=plan.impair,
    ) as rep:
        note = "\n".join(n for n in (phase.intro, rep.note) if n)
        yield LinkReport(
            ms,
            rep.shaper,
            note,
            rep.line(),
            rep.measured.get("p50_ms"),
            rep.measured.get("p90_ms"),
            rep.baseline.get("p50_ms"),
            phase.key,
        )
