"""Choosing the bucket cap and the allreduce algorithm together: a cost model of both.

``auto_cap`` prices one algorithm (gloo's flat ring) and chooses a cap. With ranks on several
nodes the algorithm matters as much as the cap, and the best cap depends on the algorithm: an
exchange that pays the slow link's latency once per bucket can afford more buckets than a ring
that pays it 2(M-1) times. So both are chosen from one model.

The model knows where the slow link is. Two measured links, each ``latency + bytes/bandwidth``
per crossing: ``cross`` between two node leaders, ``local`` between two ranks of one node. Per
bucket of ``n`` bytes, with ``N`` ranks on ``M`` nodes of ``k`` ranks:

* ``flat``: gloo's ring over all N ranks, 2(N-1) steps; each step waits on its slowest hop (the
  cross link when M > 1), and carries n/N: 2(N-1) latencies, 2(N-1)/N x n on the wire. Where a
  world allreduce was timed (``flat`` given), its fit is used instead.
* two levels (reduce to the leader, exchange among the M leaders, broadcast back): the two
  within-node legs cost ``local`` each ((k-1) latencies and n bytes), and the leaders' leg:
  ``ring`` 2(M-1) latencies and 2(M-1)/M x n; ``direct`` 1 latency and (M-1) x n;
  ``recursive-doubling`` (M a power of two) log2 M latencies and log2 M x n. Where the leaders'
  ring allreduce was timed (``ring`` given), its fit is that leg, as ``flat``'s is the world's:
  on a rate-capped link a ring's pipelined chunks and one buffer sent whole both ways do not
  get the same throughput from the same bytes.

Buckets fill in gradient-ready order (``auto_cap``'s rule) and two are in flight at once (gloo's
two workers; the hierarchical hook's one-bucket lag): their latencies overlap, their wire bytes
take turns. Each bucket also costs the rank a fixed time per call (``call_s``, per algorithm),
which a bare probe underestimates, so it is learned from the reducer's own per-step times
(:func:`learn_call_s`) where they can tell it. The (cap, algorithm) with the earliest predicted
end of communication wins; within 1% of the best, the larger cap, then the earlier algorithm
in ``ALGORITHMS``. Pure and deterministic: rank 0 evaluates it on its measurements and
broadcasts the choice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ddp.wrapper.auto_cap import CANDIDATE_CAPS_MB, IN_FLIGHT, LinkModel, fill_buckets

__all__ = [
    "ALGORITHMS",
    "CommModel",
    "Plan",
    "choose_plan",
    "fits",
    "learn_call_s",
    "predict_plan",
]

# "flat": one ring over every rank (the reducer's own allreduce); the rest: two levels, named
# by the leaders' exchange (ddp.wrapper.cross_node.CROSS_ALGORITHMS)
ALGORITHMS = ("flat", "ring", "direct", "recursive-doubling")
_MB = 1024 * 1024


@dataclass(frozen=True)
class CommModel:
    """What the choice is made from: the layout (``ranks`` on ``nodes`` nodes, ``per_node`` on
    the deciding rank's node), the links, and each algorithm's cost per call."""

    ranks: int
    nodes: int
    per_node: int
    cross: LinkModel  # one crossing between two leaders (any link when nodes == 1)
    local: LinkModel | None = None  # one hop within a node; None: free (one rank per node)
    flat: LinkModel | None = None  # a fitted world allreduce, if timed
    call_s: Mapping[str, float] = field(default_factory=dict)  # per algorithm; missing: 0
    ring: LinkModel | None = None  # a fitted allreduce among the leaders, if timed

    def __post_init__(self) -> None:
        if not (self.ranks >= 1 and 1 <= self.nodes <= self.ranks and self.per_node >= 1):
            raise ValueError(
                f"a layout needs ranks >= nodes >= 1 and per_node >= 1, got {self.ranks} "
                f"ranks, {self.nodes} nodes, {self.per_node} per node"
            )

    def bucket(self, algorithm: str, nbytes: int) -> tuple[float, float]:
        """(latency, wire seconds) of one bucket of ``nbytes`` by ``algorithm``."""
        n, m, k = self.ranks, self.nodes, self.per_node
        if algorithm == "flat":
            if self.flat is not None:
                return self.flat.latency_s, nbytes / self.flat.bytes_per_s
            hop = self.cross if m > 1 or self.local is None else self.local
            steps = 2 * (n - 1)
            return steps * hop.latency_s, steps / n * nbytes / hop.bytes_per_s
        if not fits(algorithm, m):
            raise ValueError(f"{algorithm} does not fit {m} node leaders")
        if algorithm == "ring" and self.ring is not None:
            hops, copies = 1, 1.0  # the leaders' own allreduce, timed: its fit is the leg
        elif algorithm == "ring":
            hops, copies = 2 * (m - 1), 2 * (m - 1) / m
        elif algorithm == "direct":
            hops, copies = min(1, m - 1), m - 1
        else:
            hops = copies = int(math.log2(m))
        leg = self.ring if algorithm == "ring" and self.ring is not None else self.cross
        latency = hops * leg.latency_s
        wire = copies * nbytes / leg.bytes_per_s
        if self.local is not None and k > 1:  # reduce in, broadcast out: each (k-1) hops
            latency += 2 * (k - 1) * self.local.latency_s
            wire += 2 * nbytes / self.local.bytes_per_s
        return latency, wire


def fits(algorithm: str, nodes: int) -> bool:
    """Whether ``algorithm`` can run on ``nodes`` nodes (two levels need two or more nodes;
    recursive doubling a power of two)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; one of {ALGORITHMS}")
    if algorithm == "flat":
        return True
    if nodes < 2:
        return False
    return algorithm != "recursive-doubling" or nodes & (nodes - 1) == 0


@dataclass(frozen=True)
class Plan:
    """A chosen (cap, algorithm), its predicted end of communication (seconds after backward
    began), and every candidate's prediction, so the logs can show why."""

    cap_mb: float
    algorithm: str
    predicted_s: float
    candidates: dict[tuple[float, str], float]
    reason: str = ""  # filled in by whoever adopts it, for the logs


def predict_plan(
    ready: Sequence[tuple[float, int]],
    model: CommModel,
    cap_mb: float,
    algorithm: str,
    *,
    with_calls: bool = True,
) -> float:
    """When the last bucket's communication ends, in seconds after backward began, given each
    gradient's (ready time, bytes) in ready order (``auto_cap.predict`` with the algorithm's
    latencies and bytes); ``with_calls=False`` leaves out the per-call cost (what
    :func:`learn_call_s` measures against)."""
    ends: list[float] = []
    wire = 0.0
    buckets = fill_buckets(sorted(ready), cap_mb * _MB)
    for ready_at, nbytes in buckets:
        start = max(ready_at, ends[-IN_FLIGHT] if len(ends) >= IN_FLIGHT else 0.0)
        latency, wire_s = model.bucket(algorithm, nbytes)
        wire = max(wire, start) + wire_s
        ends.append(wire + latency)
    calls = len(buckets) * model.call_s.get(algorithm, 0.0) if with_calls else 0.0
    return max(ends, default=0.0) + calls


def choose_plan(
    ready: Sequence[tuple[float, int]],
    model: CommModel,
    caps: Sequence[float] = CANDIDATE_CAPS_MB,
    algorithms: Sequence[str] = ALGORITHMS,
) -> Plan:
    """The (cap, algorithm) whose communication ends first (ties: see the module docstring)."""
    if not ready:
        raise ValueError("choosing a plan needs at least one gradient's ready time")
    usable = [a for a in algorithms if fits(a, model.nodes)]
    if not usable:
        raise ValueError(f"none of {list(algorithms)} runs on {model.nodes} node(s)")
    predicted = {(c, a): predict_plan(ready, model, c, a) for a in usable for c in caps}
    best = min(predicted.values())
    near = [key for key, t in predicted.items() if t <= best * 1.01]
    cap, algorithm = max(near, key=lambda key: (key[0], -ALGORITHMS.index(key[1])))
    return Plan(cap, algorithm, predicted[(cap, algorithm)], predicted)


def learn_call_s(
    ready: Sequence[tuple[float, int]],
    model: CommModel,
    cap_mb: float,
    algorithm: str,
    measured_s: float,
) -> float | None:
    """The cost of one call that explains a measured end of communication (seconds after
    backward began, the reducer's own stamps) under the plan that ran: what the measurement
    exceeds the link's prediction by, spread over the buckets. None where that says nothing
    about a call: with fewer than two buckets (one call cannot tell its own cost from the link
    fit's error), or a measurement at or below the prediction (the fit overestimates the
    link; calls are not free for that)."""
    buckets = len(fill_buckets(sorted(ready), cap_mb * _MB))
    base = predict_plan(ready, model, cap_mb, algorithm, with_calls=False)
    if buckets < 2 or measured_s <= base:
        return None
    return (measured_s - base) / buckets
