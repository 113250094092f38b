"""The link at one rate: every node's egress capped (tbf) and, with ``--ms``, every packet
delayed, verified by the probe (:func:`lab.shaping.link.shaped`: the delay on TCP echoes, the
rate on a TCP bulk transfer) for as long as the jobs at that rate run. A shaping failure
becomes a :class:`~lab.engine.client.LabError`: a link that is not what was asked means nothing
was measured."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from lab.engine.client import LabError
from lab.engine.cluster import Cluster
from lab.experiments.compress.plan import CompressPlan
from lab.experiments.compress.result import LinkInfo
from lab.shaping.base import LinkMismatch, ShapingError, nodes_of
from lab.shaping.link import shaped

__all__ = ["capped"]


@contextlib.contextmanager
def capped(
    cluster: Cluster, plan: CompressPlan, rate_mbit: float, max_seconds: float
) -> Iterator[LinkInfo]:
    """Shape every node at ``rate_mbit`` (and ``plan.ms``), yield what was measured, undo."""
    entered = False
    try:
        with shaped(nodes_of(cluster), plan.ms, plan.shaper, rate_mbit,
                    max_seconds=max_seconds) as rep:  # fmt: skip
            entered = True
            yield LinkInfo(
                rate_mbit, rep.shaper, rep.line(), rep.note, rep.bulk.get("mbit_s"),
                rep.measured.get("p50_ms"), rep.baseline.get("p50_ms"),
            )  # fmt: skip
    except LinkMismatch as e:
        raise LabError(
            f"link check failed at {rate_mbit:g} Mbit/s, nothing was measured: {e}"
        ) from None
    except ShapingError as e:
        when = "undoing the shaping" if entered else "shaping the link"
        raise LabError(f"{when} at {rate_mbit:g} Mbit/s failed: {e}") from None
