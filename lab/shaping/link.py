"""A shaped link between a set of nodes, verified, as one context manager: :func:`shaped`.

Order matters and is kept here so callers cannot get it wrong:

1. choose the shaper (``auto``: probe the first node's kernel, before anything is applied);
2. start the probe server on the second node and measure the baseline round trip;
3. apply the shaper node by node (each node's steps undo themselves, see
   :meth:`lab.shaping.base.Shaper.applied`);
4. measure again and verify: a shaper that is not doing what was asked stops the run here;
5. on exit, also after errors: undo node by node in reverse order, then stop the server.

Per-node delays (``node_ms``, an asymmetric link: e.g. one slow node) get one shaper per node;
a round trip between nodes i and j then adds ``d_i + d_j`` with either shaper (netem delays
what i sends, the delayer what i receives), and the probe runs from the slowest node, so what
is verified is the link that was made different.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
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
    node_ms: dict[int, float] = field(default_factory=dict)  # per-node delays, where given
    probed: tuple[int, int] = (0, 1)  # (client, server) of the probe

    @property
    def expected_added_ms(self) -> float:
        """What the shaping should add to the probed round trip: both ends' one-way delays."""
        return sum(self.node_ms.get(i, self.ms) for i in self.probed)

    def line(self) -> str:
        """One line for the console: asked vs measured, with the baseline beside it."""
        asked = f"{self.ms:g} ms one-way (round trip +{2 * self.ms:g} ms)"
        if self.node_ms:
            into = ", ".join(f"node{i} {ms:g} ms" for i, ms in sorted(self.node_ms.items()))
            a, b = self.probed
            asked = (
                f"{into}, others {self.ms:g} ms one-way (round trip node{a}-node{b} "
                f"+{self.expected_added_ms:g} ms)"
            )
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
    node_ms: Mapping[int, float] | None = None,
) -> Iterator[ShapingReport]:
    """Shape traffic between ``nodes`` (one-way delay ``ms`` per packet, or ``node_ms[i]`` for
    node i; optional rate), verify, undo.

    Raises ShapingError when a command fails and LinkMismatch when the measured round trip is
    off by more than 20% of what the shaping should add; in both cases whatever was applied is
    removed again. ``max_seconds`` bounds every background process the shaping starts.
    """
    if len(nodes) < 2:
        raise ValueError(f"shaping needs at least 2 nodes to verify, got {len(nodes)}")
    node_ms = dict(node_ms or {})
    bad = sorted(i for i in node_ms if not 0 <= i < len(nodes))
    if bad:
        raise ValueError(f"per-node delays for nodes {bad}, but the nodes are 0..{len(nodes) - 1}")
    delays = [node_ms.get(i, ms) for i in range(len(nodes))]
    if not all(d >= 0 for d in delays) or (not any(delays) and not rate_mbit):
        raise ValueError(f"nothing to shape: ms={ms!r}, node_ms={node_ms!r}, rate={rate_mbit!r}")
    choice = choose_shaper(shaper, nodes[0].run, nodes[0].dev)
    # The probe runs from the slowest node (node 0 when all are alike) to the next one.
    slow = max(range(len(nodes)), key=lambda i: (delays[i], -i))
    probed = (slow, (slow + 1) % len(nodes))
    report = ShapingReport(choice.name, choice.note, ms, rate_mbit, node_ms=node_ms, probed=probed)
    client, server = nodes[probed[0]], nodes[probed[1]]
    with contextlib.ExitStack() as undo:
        # Callbacks run in reverse: the nodes' shaping in reverse order, the server last.
        undo.callback(probe.stop_server, server)
        probe.start_server(server, probe_port, max_seconds, python)
        report.baseline = probe.ping(client, server, probe_port, python, probe_count)
        for node, delay in zip(nodes, delays, strict=True):
            if delay == 0 and not rate_mbit:
                continue  # nothing to do on this node
            impl = choice.shaper(delay, rate_mbit, queue=queue, python=python,
                                 max_seconds=max_seconds)  # fmt: skip
            peers = [n.address for n in nodes if n is not node]
            undo.enter_context(impl.applied(node, peers))
        report.measured = probe.ping(client, server, probe_port, python, probe_count)
        if report.expected_added_ms > 0:
            try:
                probe.verify(
                    report.measured["p50_ms"], report.expected_added_ms / 2,
                    report.baseline["p50_ms"],
                )  # fmt: skip
            except ValueError as e:
                raise LinkMismatch(f"{report.line()}: {e}") from None
        yield report
