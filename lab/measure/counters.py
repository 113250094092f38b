"""Each node's eth0 byte counters, sampled in the node while a job runs, so that the bytes that
crossed the link can be cut to exactly the measured steps (:mod:`lab.experiments.topology.wire`
does that, from the step records' wall clocks).

Why a sampler and not two reads around the job: a job's total holds its set-up (gloo's
connections, the parameter broadcast) and two ``docker exec`` reads cannot be placed at step
boundaries. A small Python loop in the node reads ``/sys/class/net/eth0/statistics`` every
10 ms with ``time.time()`` beside it (containers share the host's clock, as the ranks' step
records do); it bounds its own life and is stopped after the job.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Iterator

from lab.engine.cluster import Cluster
from lab.shaping.base import background, node_path, nodes_of

__all__ = ["INTERVAL_S", "sampled"]

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
