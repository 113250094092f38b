"""The straggler's slow link: every packet into (netem: out of) the straggler's node delayed by
``--slow-link-ms``, the other nodes' links untouched, verified by the probe from the straggler
to a peer (:func:`lab.shaping.link.shaped` with per-node delays) for as long as the slowed job
runs (:func:`lab.shaping.verified_link.verified_link`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from lab.engine.cluster import Cluster
from lab.experiments.straggler.plan import StragglerPlan
from lab.shaping.verified_link import verified_link

__all__ = ["slow_link"]


@contextlib.contextmanager
def slow_link(cluster: Cluster, plan: StragglerPlan, max_seconds: float) -> Iterator[str]:
    """Shape the straggler's link, yield the probe's line (asked vs measured), undo."""
    with verified_link(
        cluster,
        "for the slow link",
        0.0,
        plan.shaper,
        node_ms={plan.node: plan.slow_link_ms},
        max_seconds=max_seconds,
        impair=plan.impair,
    ) as rep:
        yield (f"{rep.note}\n" if rep.note else "") + rep.line()
