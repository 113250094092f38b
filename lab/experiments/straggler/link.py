"""The straggler's slow link: every packet into (netem: out of) the straggler's node delayed by
``--slow-link-ms``, the other nodes' links untouched, verified by the probe from the straggler
to a peer (:func:`lab.shaping.link.shaped` with per-node delays) for as long as the slowed job
runs. A shaping failure becomes a :class:`~lab.engine.client.LabError`: a link that is not what
was asked means nothing was measured."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from lab.engine.client import LabError
from lab.engine.cluster import Cluster
from lab.experiments.straggler.plan import StragglerPlan
from lab.shaping.base import LinkMismatch, ShapingError, nodes_of
from lab.shaping.link import shaped

__all__ = ["slow_link"]


@contextlib.contextmanager
def slow_link(cluster: Cluster, plan: StragglerPlan, max_seconds: float) -> Iterator[str]:
    """Shape the straggler's link, yield the probe's line (asked vs measured), undo."""
    entered = False
    try:
        with shaped(nodes_of(cluster), 0.0, plan.shaper, node_ms={plan.node: plan.slow_link_ms},
                    max_seconds=max_seconds, impair=plan.impair) as rep:  # fmt: skip
            entered = True
            yield (f"{rep.note}\n" if rep.note else "") + rep.line()
    except LinkMismatch as e:
        raise LabError(f"slow link check failed, nothing was measured: {e}") from None
    except ShapingError as e:
        when = "undoing the slow link" if entered else "shaping the slow link"
        raise LabError(f"{when} failed: {e}") from None
