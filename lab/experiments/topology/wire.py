"""Bytes that crossed the link between the nodes during a time window, from each node's
sampled eth0 counters (:mod:`.counters`). Pure.

A node's eth0 carries only its traffic with other nodes (its own ranks talk over loopback), so
the bytes every node's eth0 sent, summed over the nodes, are the bytes on the link between
them: gradients, the per-step gathers, TCP/IP headers and ACKs. Each counter is interpolated
linearly between the two samples around a window's ends.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Sample", "Window", "at", "parse_samples", "window_bytes"]


@dataclass(frozen=True)
class Sample:
    t: float  # wall clock, seconds
    tx: int  # eth0's tx_bytes
    rx: int


def parse_samples(text: str, where: str) -> list[Sample]:
    """The sampler's ``"<time> <tx> <rx>"`` lines, in time order; a line cut by the stop (the
    last) is dropped. ValueError naming ``where`` when there is nothing to read."""
    samples = []
    for line in text.splitlines():
        parts = line.split()
        try:
            samples.append(Sample(float(parts[0]), int(parts[1]), int(parts[2])))
        except (ValueError, IndexError):
            continue
    if len(samples) < 2:
        raise ValueError(f"{where}: eth0's counters were not sampled (got {text[-200:]!r})")
    return sorted(samples, key=lambda s: s.t)


def at(samples: Sequence[Sample], t: float, where: str) -> tuple[float, float]:
    """(tx, rx) at wall clock ``t``, interpolated; ValueError if ``t`` is outside the samples."""
    if not samples[0].t <= t <= samples[-1].t:
        raise ValueError(
            f"{where}: the counters were sampled from {samples[0].t:.3f} to {samples[-1].t:.3f}, "
            f"not at {t:.3f} (a clock apart from the ranks'?)"
        )
    i = max(1, bisect.bisect_left([s.t for s in samples], t))
    a, b = samples[i - 1], samples[i]
    f = 0.0 if b.t == a.t else (t - a.t) / (b.t - a.t)
    return a.tx + f * (b.tx - a.tx), a.rx + f * (b.rx - a.rx)


@dataclass(frozen=True)
class Window:
    """What crossed the link between ``start`` and ``end``: bytes sent and received, summed over
    the nodes (equal but for packets in flight at the ends)."""

    start: float
    end: float
    tx: float
    rx: float


def window_bytes(
    per_node: Mapping[int, Sequence[Sample]], start: float, end: float, where: str
) -> Window:
    tx = rx = 0.0
    for node, samples in sorted(per_node.items()):
        (tx0, rx0), (tx1, rx1) = (at(samples, t, f"{where} node{node}") for t in (start, end))
        tx, rx = tx + tx1 - tx0, rx + rx1 - rx0
    return Window(start, end, tx, rx)
