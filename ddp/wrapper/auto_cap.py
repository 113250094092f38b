"""Choosing ``bucket_cap_mb`` for the link: a cost model, fitted once, evaluated per candidate.

A bucket cap trades two costs. Small buckets start their allreduce early, hiding it behind the
rest of backward, but every call pays the link's latency; large buckets pay the latency once
but start late, after most of backward is over. Which wins depends on the link and on when the
gradients become ready, and torch's 25 MB default is a guess for neither.

The model: one allreduce of ``n`` bytes takes ``latency_s + n / bytes_per_s`` (fitted from
timed allreduces of a few sizes); buckets fill in gradient-ready order and close once they hold
``cap`` bytes; each starts when its last gradient is ready and a gloo worker is free (two run
at once: their latencies overlap, their bytes take turns on the link); the step's
communication ends when the last bucket's does. Every call also costs the rank CPU
(``call_cpu_s``, measured as process CPU time per small allreduce): on a host with fewer cores
than ranks that time hides behind nothing, so it is added once per bucket. The cap with the
earliest end wins. Pure: the
wrapper feeds it rank 0's measurements and broadcasts the choice, so every rank rebuilds the
same plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "CANDIDATE_CAPS_MB",
    "IN_FLIGHT",
    "MAX_BYTES_PER_S",
    "CapChoice",
    "LinkModel",
    "choose_cap",
    "fill_buckets",
    "fit_link",
    "predict",
]

# ProcessGroupGloo's default worker threads: how many collectives of a group run at once
IN_FLIGHT = 2
# 0 is one bucket per gradient; the rest span latency-bound to bandwidth-bound links
CANDIDATE_CAPS_MB = (0.0, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 25.0)
_MB = 1024 * 1024
# The fastest link a fit may report (1 TB/s): where the probe's times do not grow with size
# (loopback, noise), the fitted slope is zero or negative and is clamped to this.
MAX_BYTES_PER_S = 1e12


@dataclass(frozen=True)
class LinkModel:
    """Time of one allreduce of ``n`` bytes on this group: ``latency_s + n / bytes_per_s``,
    and the CPU time one call costs the rank (``call_cpu_s``), which nothing overlaps when the
    cores are all busy (4 ranks on 2 cores: 1.8 ms more per step for every extra bucket, 2.0 ms
    of CPU per small allreduce)."""

    latency_s: float
    bytes_per_s: float
    call_cpu_s: float = 0.0

    def __post_init__(self) -> None:
        if not (self.latency_s >= 0 and self.bytes_per_s > 0 and self.call_cpu_s >= 0):
            raise ValueError(
                f"a link needs latency >= 0, bandwidth > 0 and CPU per call >= 0, got {self}"
            )

    def seconds(self, nbytes: int) -> float:
        return self.latency_s + nbytes / self.bytes_per_s


@dataclass(frozen=True)
class CapChoice:
    """The chosen cap, and the predicted end of communication (seconds after backward began)
    for every candidate, so the logs can show why."""

    cap_mb: float
    predicted_s: dict[float, float]


def fit_link(samples: Sequence[tuple[int, float]], call_cpu_s: float = 0.0) -> LinkModel:
    """Least-squares fit of ``seconds = latency + bytes / bandwidth`` to (bytes, seconds)
    samples of at least two sizes. Noise can make the fitted latency or slope negative; they
    are clamped to what is physical (no negative latency, at most a 1 TB/s link)."""
    sizes = {n for n, _ in samples}
    if len(sizes) < 2:
        raise ValueError("fitting a link needs allreduce timings of at least two sizes")
    k = len(samples)
    mean_n = sum(n for n, _ in samples) / k
    mean_t = sum(t for _, t in samples) / k
    var = sum((n - mean_n) ** 2 for n, _ in samples)
    slope = sum((n - mean_n) * (t - mean_t) for n, t in samples) / var
    slope = max(slope, 1.0 / MAX_BYTES_PER_S)
    latency = max(mean_t - slope * mean_n, 0.0)
    return LinkModel(latency_s=latency, bytes_per_s=1.0 / slope, call_cpu_s=call_cpu_s)


def fill_buckets(ready: Sequence[tuple[float, int]], cap_bytes: float) -> list[tuple[float, int]]:
    """(ready time, bytes) per bucket: gradients in ready order, a bucket closing once it holds
    ``cap_bytes`` (0: every gradient alone)."""
    out, ready_at, size = [], 0.0, 0
    for at, nbytes in ready:
        ready_at, size = max(ready_at, at), size + nbytes
        if size >= cap_bytes:
            out.append((ready_at, size))
            ready_at, size = 0.0, 0
    if size:
        out.append((ready_at, size))
    return out


def predict(ready: Sequence[tuple[float, int]], link: LinkModel, cap_mb: float) -> float:
    """When the last bucket's allreduce ends, in seconds after backward began, given each
    gradient's (ready time, bytes) in the order they became ready.

    gloo runs ``IN_FLIGHT`` collectives of a group at once (its worker threads): a bucket
    starts once it is ready and the bucket ``IN_FLIGHT`` places before it has ended, so their
    latencies overlap; their bytes share the link, one bucket's after the other's. Each call's
    CPU time comes on top: it delays the rank whether or not the wire is busy."""
    ends: list[float] = []
    wire = 0.0  # when the link has carried every byte so far
    buckets = fill_buckets(sorted(ready), cap_mb * _MB)
    for ready_at, nbytes in buckets:
        start = max(ready_at, ends[-IN_FLIGHT] if len(ends) >= IN_FLIGHT else 0.0)
        wire = max(wire, start) + nbytes / link.bytes_per_s
        ends.append(wire + link.latency_s)
    return max(ends, default=0.0) + len(buckets) * link.call_cpu_s


def choose_cap(
    ready: Sequence[tuple[float, int]],
    link: LinkModel,
    candidates: Sequence[float] = CANDIDATE_CAPS_MB,
) -> CapChoice:
    """The candidate cap (MB) whose communication ends first; within 1% of the best, the
    larger cap wins (fewer calls: less CPU per step, and less exposed to a latency the probe
    underestimated)."""
    if not ready:
        raise ValueError("choosing a cap needs at least one gradient's ready time")
    predicted = {cap: predict(ready, link, cap) for cap in candidates}
    best = min(predicted.values())
    cap = max(c for c, t in predicted.items() if t <= best * 1.01)
    return CapChoice(cap_mb=cap, predicted_s=predicted)
