"""Per bucket: how long backward computed to fill it and how long its allreduce took, the
figures that decide whether overlap can pay (and that the default workload was chosen from).

Overlap can hide an allreduce only behind the backward that runs after its bucket filled, and
the last bucket's allreduce never hides. So per configuration, medians over every rank's
measured steps (warm-up steps excluded), in ms:

- ``compute_ms``: the backward that filled bucket k, from the previous bucket's launch (bucket
  0: from backward's start) to this one's. Only with overlap on, where a bucket is launched
  when it fills; with overlap off every bucket is launched when backward ends (``None``).
- ``launch_ms``: when its allreduce started, from backward's start.
- ``comm_ms``: launch to done (done is seen on gloo's thread when the allreduce completes).
- ``after_backward_ms``: how far past the end of backward it completed (0 if before): what
  of it the step had to wait for.

Why here and not in ``lab latency``: the figures are what one job's step records say about its
buckets, a measurement like the measured window (:mod:`.windows`), and any experiment whose
ranks log the bucket timeline can take them; ``lab latency`` prints them beside its Gantt chart.
Built from ``ddp.program.records.StepRecord``'s ``backward_ms`` and ``buckets_ms``. Pure.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from ddp.torchfree import RankLog, StepRecord

__all__ = ["BucketTiming", "ConfigTiming", "time_buckets"]


@dataclass(frozen=True)
class BucketTiming:
    bucket: int
    compute_ms: float | None  # None with overlap off: the fill time is not observed
    launch_ms: float
    comm_ms: float
    after_backward_ms: float


@dataclass(frozen=True)
class ConfigTiming:
    """One configuration's medians: the phases of a step and each bucket."""

    config: str
    overlap: bool
    forward_ms: float
    backward_ms: float
    step_ms: float  # the slowest rank's per step, then the median (as in the table)
    samples: int  # rank-steps the medians are taken over
    buckets: tuple[BucketTiming, ...]

    @property
    def comm_ms(self) -> float:
        """Sum of the buckets' allreduce times (more than wall time when two are in flight)."""
        return sum(b.comm_ms for b in self.buckets)


def _measured(logs: Mapping[int, RankLog], warmup: int) -> list[StepRecord]:
    return [
        r
        for log in logs.values()
        for r in log.steps
        if r.step > warmup and r.backward_ms is not None and r.buckets_ms
    ]


def time_buckets(
    logs: Mapping[int, RankLog], warmup: int, config: str, overlap: bool, where: str = "logs"
) -> ConfigTiming:
    """Medians of one configuration's run(s) (``logs`` of one job). ValueError when no measured
    step carries a bucket timeline, or the ranks disagree on the number of buckets."""
    records = _measured(logs, warmup)
    if not records:
        raise ValueError(f"{where}: no measured step with a bucket timeline")
    counts = {len(r.buckets_ms or []) for r in records}
    if len(counts) != 1:
        raise ValueError(f"{where}: steps disagree on the number of buckets: {sorted(counts)}")
    n = counts.pop()
    med = statistics.median

    def rel(r: StepRecord, t: float) -> float:
        return t - r.backward_ms[0]  # type: ignore[index]

    buckets = []
    for k in range(n):
        compute = None
        if overlap:
            compute = med(
                rel(r, r.buckets_ms[k][0]) - (rel(r, r.buckets_ms[k - 1][0]) if k else 0.0)  # type: ignore[index]
                for r in records
            )
        buckets.append(
            BucketTiming(
                k,
                compute,
                med(rel(r, r.buckets_ms[k][0]) for r in records),  # type: ignore[index]
                med(r.buckets_ms[k][1] - r.buckets_ms[k][0] for r in records),  # type: ignore[index]
                med(max(0.0, r.buckets_ms[k][1] - r.backward_ms[1]) for r in records),  # type: ignore[index]
            )
        )
    by_step: dict[int, float] = {}
    for r in records:
        by_step[r.step] = max(by_step.get(r.step, 0.0), r.step_ms)
    return ConfigTiming(
        config,
        overlap,
        forward_ms=med(r.backward_ms[0] for r in records),  # type: ignore[index]
        backward_ms=med(r.backward_ms[1] - r.backward_ms[0] for r in records),  # type: ignore[index]
        step_ms=med(by_step.values()),
        samples=len(records),
        buckets=tuple(buckets),
    )
