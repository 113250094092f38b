"""An experiment's shaped link: :func:`lab.shaping.link.shaped` on every node of a cluster, with
its failures as the :class:`~lab.engine.client.LabError` the CLI prints. A link that is not what
was asked means nothing was measured; shaping that cannot be undone after the jobs ran is
reported too (the nodes are removed anyway)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from lab.engine.client import LabError
from lab.engine.cluster import Cluster
from lab.shaping.across import round_trips
from lab.shaping.base import LinkMismatch, ShapingError, nodes_of
from lab.shaping.link import ShapingReport, shaped

__all__ = ["verified_link"]


@contextlib.contextmanager
def verified_link(
    cluster: Cluster, where: str, ms: float, shaper: str, rate_mbit: float | None = None, **kw: Any
) -> Iterator[ShapingReport]:
    """Shape and verify the cluster's links (``shaped``'s arguments), yield the probe's report,
    undo on the way out. ``where`` ends the errors' subject: "at 5 ms", "for the slow link"."""
    entered = False
    try:
        across = round_trips(cluster)  # across engines: VXLAN's own round trip, before shaping
        with shaped(nodes_of(cluster), ms, shaper, rate_mbit, **kw) as report:
            entered = True
            if across:
                report.checks.insert(0, across)
            yield report
    except LinkMismatch as e:
        raise LabError(f"link check failed {where}, nothing was measured: {e}") from None
    except ShapingError as e:
        when = "undoing the shaping" if entered else "shaping the link"
        raise LabError(f"{when} {where} failed: {e}") from None
