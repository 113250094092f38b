"""The unshaped round trip between hosts (VXLAN over the swarm overlay) beside the one within a
host, for runs across several engines: what a shaped delay is added to, and why a run across
hosts is slower before any shaping.

Measured with the link probe (:mod:`lab.node.probe`, TCP echo p50) before the link is shaped,
between the first two nodes on different hosts and, where a host runs two nodes, between
those; one line for the link report.
"""

from __future__ import annotations

from typing import Any

from lab.shaping import probe
from lab.shaping.base import nodes_of

__all__ = ["pairs", "round_trips"]

_PORT = 7412  # beside the link probe's 7411, which may be serving at the same time


def pairs(hosts: list[str]) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """(two nodes on different hosts, two nodes on one host), each None if there is none;
    ``hosts[i]`` is node i's host. Pure."""
    across = within = None
    for i in range(len(hosts)):
        for j in range(i + 1, len(hosts)):
            if hosts[i] != hosts[j] and across is None:
                across = (i, j)
            if hosts[i] == hosts[j] and within is None:
                within = (i, j)
    return across, within


def round_trips(cluster: Any, count: int = 50, max_seconds: float = 120.0) -> str | None:
    """One line: ``unshaped round trip p50: across hosts (VXLAN) node0 host0 - node1 host1
    0.41 ms; within host0 node0 - node3 0.09 ms``; None on one engine."""
    hosts = [n.host for n in cluster.nodes]
    if len(set(hosts)) < 2:
        return None
    nodes = nodes_of(cluster)
    parts = []
    across, within = pairs(hosts)
    for what, pair in (
        ("across hosts (VXLAN)", across),
        (f"within {hosts[within[0]]}" if within else "within one host", within),
    ):
        if pair is None:
            parts.append(f"{what}: no two nodes share a host (--placement can put two on one)")
            continue
        a, b = pair
        probe.start_server(nodes[b], _PORT, max_seconds)
        try:
            p50 = probe.ping(nodes[a], nodes[b], _PORT, count=count)["p50_ms"]
        finally:
            probe.stop_server(nodes[b])
        parts.append(f"{what} node{a} {hosts[a]} - node{b} {hosts[b]} {p50:.2f} ms")
    return "unshaped round trip p50: " + "; ".join(parts)
