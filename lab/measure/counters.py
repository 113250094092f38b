"""Each node's eth0 byte counters, sampled in the node while a job runs, so that the bytes that
crossed the link can be cut to exactly the measured steps (:func:`window_bytes`, from the step
records' wall clocks).

Why a sampler and not two reads around the job: a job's total holds its set-up (gloo's
connections, the parameter broadcast) and two ``docker exec`` reads cannot be placed at step
boundaries. A small Python loop in the node reads ``/sys/class/net/eth0/statistics`` every
10 ms with ``time.time()`` beside it (containers share the host's clock, as the ranks' step
records do); it bounds its own life and is stopped after the job.
"""

from __future__ import annotations

import bisect
import contextlib
import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from lab.engine.cluster import Cluster
from lab.shaping.base import background, node_path, nodes_of

__all__ = ["INTERVAL_S", "Sample", "Window", "at", "parse_samples", "sampled", "window_bytes"]

INTERVAL_S = 0.01
_LOOP = (
    "import sys, time\n"
    "d, end = '/sys/class/net/eth0/statistics/', time.time() + float(sys.argv[1])\n"
    "while time.time() < end:\n"
    "    t = time.time()\n"
    "    tx, rx = (open(d + k + '_bytes').read().split()[0] for k in ('tx', 'rx'))\n"
    "    print(f'{t:.4f} {tx} {rx}', flush=True)\n"
    f"    time.sleep({INTERVAL_S})\n"
)


@contextlib.contextmanager
def sampled(cluster: Cluster, what: str, max_seconds: float) -> Iterator[dict[int, str]]:
    """Sample every node's counters for the body; the yielded dict is filled on the way out
    with each node's samples (``"<time> <tx> <rx>"`` lines), the sampler stopped."""
    nodes = nodes_of(cluster)
    texts: dict[int, str] = {}
    for node in nodes:
        background(node, ["python3", "-c", _LOOP, f"{max_seconds:g}"], what)
    try:
        yield texts
    finally:
        for i, node in enumerate(nodes):
            pid, log = node_path(node, f"{what}.pid.sh"), node_path(node, f"{what}.log")
            node.run(["sh", "-c", f"kill -TERM $(cat {pid}) 2>/dev/null; rm -f {pid}"])
            texts[i] = node.run(["sh", "-c", f"cat {shlex.quote(log)}; rm -f {log}"])[1]


# ------------------------------------------------------------------------------------------
# Bytes that crossed the link between the nodes during a time window, from each node's
# sampled eth0 counters (:func:`sampled`). Pure.
#
# A node's eth0 carries only its traffic with other nodes (its own ranks talk over loopback), so
# the bytes every node's eth0 sent, summed over the nodes, are the bytes on the link between
# them: gradients, the per-step gathers, TCP/IP headers and ACKs. Each counter is interpolated
# linearly between the two samples around a window's ends.


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
