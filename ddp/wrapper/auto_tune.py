"""``bucket_cap_mb='auto'`` at run time: measure, decide on rank 0, rebuild everywhere.

The wrapper starts with torch's default plan. At the bucket rebuild (before the second
synchronised forward, where torch re-plans in the order gradients arrived) every rank times a
few plain allreduces of growing size on its group, rank 0 fits the link and, with the ready
times of its own last backward, predicts each candidate cap's communication (``auto_cap``) and
broadcasts its choice (as JSON, ``ddp.wrapper.wire``); every rank then rebuilds with that cap.
The plan stays identical on every rank because only rank 0's measurements decide.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from ddp.wrapper.auto_cap import CapChoice, LinkModel, choose_cap, fit_link
from ddp.wrapper.wire import broadcast_json

__all__ = ["PROBE_BYTES", "AutoCap", "measure_link", "tune", "wants_auto"]

# Allreduce sizes the link is timed at (each capped at the model's gradient bytes), from
# latency-bound to bandwidth-bound, and how often each: the fastest run counts (noise only
# adds). The large sizes run once: at 20 Mbit/s a 1 MB allreduce of 4 ranks takes ~0.6 s.
# The smallest size also gives the CPU time of one call (the median of its runs: a call's
# CPU is what it is, not a wait that noise stretches). Fixed, not time-bounded: every rank
# must issue the same collectives.
PROBE_BYTES = (4 << 10, 64 << 10, 512 << 10, 1 << 20)
PROBE_REPS = (5, 3, 1, 1)


class AutoCap:
    """What the auto cap chose and why: the cap, the fitted link and the predictions."""

    def __init__(self, choice: CapChoice, link: LinkModel, probe_s: float) -> None:
        self.cap_mb = choice.cap_mb
        self.predicted_s = choice.predicted_s
        self.link = link
        self.probe_s = probe_s

    def summary(self) -> dict[str, Any]:
        """For the logs and ``_get_ddp_logging_data()``: plain numbers, ms and MB/s."""
        return {
            "cap_mb": self.cap_mb,
            "predicted_ms": {str(c): round(t * 1e3, 3) for c, t in self.predicted_s.items()},
            "link_latency_ms": round(self.link.latency_s * 1e3, 3),
            "link_mb_per_s": round(self.link.bytes_per_s / (1 << 20), 3),
            "call_cpu_ms": round(self.link.call_cpu_s * 1e3, 3),
            "probe_ms": round(self.probe_s * 1e3, 1),
        }


def wants_auto(
    bucket_cap_mb: float | str | None, find_unused_parameters: bool
) -> tuple[bool, float | None]:
    """(whether the cap is to be chosen, the cap to start with: torch's default if so)."""
    if bucket_cap_mb != "auto":
        return False, bucket_cap_mb  # type: ignore[return-value]
    if find_unused_parameters:
        raise ValueError(
            "bucket_cap_mb='auto' chooses the cap when the buckets are rebuilt, which "
            "find_unused_parameters=True never does (torch's rule); give a number instead"
        )
    return True, None


def measure_link(
    group: dist.ProcessGroup | None, max_bytes: int
) -> tuple[list[tuple[int, float]], float]:
    """(bytes, seconds) of plain allreduces on ``group``, and the process CPU time (all
    threads: gloo's workers do the work) of one call at the smallest size; a collective on
    every rank."""
    reps = {}
    for n, k in zip(PROBE_BYTES, PROBE_REPS, strict=True):
        size = max(4, min(n, max_bytes))
        reps[size] = max(reps.get(size, 0), k)
    if len(reps) < 2:
        reps = {4: 3, max(8, max_bytes): 1}
    dist.all_reduce(torch.zeros(1), group=group)  # line the ranks up before the first timing
    samples, cpu = [], []
    smallest = min(reps)
    for n, k in sorted(reps.items()):
        for _ in range(k):
            t = torch.zeros(n // 4)
            c0, t0 = time.process_time(), time.perf_counter()
            dist.all_reduce(t, group=group)
            samples.append((n, time.perf_counter() - t0))
            if n == smallest:
                cpu.append(time.process_time() - c0)
    best: dict[int, float] = {}
    for n, s in samples:
        best[n] = min(s, best.get(n, s))
    return sorted(best.items()), statistics.median(cpu)


def tune(reducer: Any, group: dist.ProcessGroup | None, logging: Any) -> AutoCap:
    """Measure the link, let rank 0 choose, and return the choice every rank now shares (also
    in the logging data, ``auto_bucket_cap``)."""
    t0 = time.perf_counter()
    ready = reducer.ready_profile()
    # the plan's bytes, the same on every rank (a rank's ready profile is not: a joined rank
    # recorded none), so every rank probes the same sizes
    samples, call_cpu_s = measure_link(group, sum(reducer.bucket_sizes))
    probe_s = time.perf_counter() - t0
    decided = None
    if dist.get_rank(group) == 0:
        link = fit_link(samples, call_cpu_s)
        decided = _to_json(AutoCap(choose_cap(ready or [(0.0, 4)], link), link, probe_s))
    src = dist.get_global_rank(group, 0) if group is not None else 0
    chosen = _from_json(broadcast_json(decided, src=src, group=group))
    logging.data["auto_bucket_cap"] = json.dumps(chosen.summary())
    return chosen


def _to_json(chosen: AutoCap) -> dict[str, Any]:
    """Rank 0's choice as JSON, exact (float repr round-trips), for the other ranks."""
    return {
        "cap_mb": chosen.cap_mb,
        "predicted_s": [[c, t] for c, t in chosen.predicted_s.items()],
        "link": [chosen.link.latency_s, chosen.link.bytes_per_s, chosen.link.call_cpu_s],
        "probe_s": chosen.probe_s,
    }


def _from_json(data: dict[str, Any]) -> AutoCap:
    choice = CapChoice(float(data["cap_mb"]), {float(c): float(t) for c, t in data["predicted_s"]})
    return AutoCap(choice, LinkModel(*(float(v) for v in data["link"])), float(data["probe_s"]))
