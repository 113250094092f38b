"""A shaped link between a set of nodes, verified, as one context manager: :func:`shaped`.

Order matters and is kept here so callers cannot get it wrong:

1. choose the shaper (``auto``: probe the first node's kernel, before anything is applied);
2. start the probe server on the second node and measure the baseline round trip;
3. apply the shaper node by node (each node's steps undo themselves, see
   :meth:`lab.shaping.base.Shaper.applied`);
4. measure again and verify: a shaper that is not doing what was asked stops the run here;
5. on exit, also after errors: undo node by node in reverse order, then stop the server.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from lab.shaping import probe
from lab.shaping.base import LinkMismatch, Node
from lab.shaping.registry import choose_shaper

__all__ = ["ShapingReport", "shaped"]


@dataclass
class ShapingReport:
    """What was applied and what the probe measured (round trips in ms, p50 of echoes)."""

    shaper: str
    note: str
    ms: float
    rate_mbit: float | None
    baseline: dict[str, float] = field(default_factory=dict)
    measured: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        """One line for the console: asked vs measured, with the baseline beside it."""
        asked = f"{self.ms:g} ms one-way (round trip +{2 * self.ms:g} ms)"
        rate = f", rate {self.rate_mbit:g} Mbit/s" if self.rate_mbit else ""
        return (
            f"shaper {self.shaper}: asked {asked}{rate}; measured round trip p50 "
            f"{self.measured.get('p50_ms', float('nan')):.2f} ms p90 "
            f"{self.measured.get('p90_ms', float('nan')):.2f} ms "
            f"(unshaped p50 {self.baseline.get('p50_ms', float('nan')):.2f} ms)"
        )


@contextlib.contextmanager
def shaped(
    nodes: Sequence[Node],
    ms: float,
    shaper: str = "auto",
    rate_mbit: float | None = None,
    *,
    queue: int = 0,
    probe_port: int = 7411,
    probe_count: int = 50,
    python: str = "python3",
    max_seconds: float = 3600.0,
) -> Iterator[ShapingReport]:
    """Shape traffic between ``nodes`` (one-way delay ``ms`` per packet, optional rate), verify,
    undo.

    Raises ShapingError when a command fails and LinkMismatch when the measured round trip is
    off by more than 20% of ``2 * ms``; in both cases whatever was applied is removed again.
    ``max_seconds`` bounds every background process the shaping starts.
    """
    if len(nodes) < 2:
        raise ValueError(f"shaping needs at least 2 nodes to verify, got {len(nodes)}")
    if not ms >= 0 or (ms == 0 and not rate_mbit):
        raise ValueError(f"nothing to shape: ms={ms!r}, rate_mbit={rate_mbit!r}")
    choice = choose_shaper(shaper, nodes[0].run, nodes[0].dev)
    impl = choice.shaper(ms, rate_mbit, queue=queue, python=python, max_seconds=max_seconds)
    report = ShapingReport(choice.name, choice.note, ms, rate_mbit)
    server, client = nodes[1], nodes[0]
    with contextlib.ExitStack() as undo:
        # Callbacks run in reverse: the nodes' shaping in reverse order, the server last.
        undo.callback(probe.stop_server, server)
        probe.start_server(server, probe_port, max_seconds, python)
        report.baseline = probe.ping(client, server, probe_port, python, probe_count)
        for node in nodes:
            peers = [n.address for n in nodes if n is not node]
            undo.enter_context(impl.applied(node, peers))
        report.measured = probe.ping(client, server, probe_port, python, probe_count)
        if ms > 0:
            try:
                probe.verify(report.measured["p50_ms"], ms, report.baseline["p50_ms"])
            except ValueError as e:
                raise LinkMismatch(f"{report.line()}: {e}") from None
        yield report
