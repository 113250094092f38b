"""What ``lab run`` found, from the run's result alone: the step times (per rank, and the job's:
the slowest rank's per step), the bytes that crossed the link per step (every node's eth0
tx_bytes summed, as ``lab topology`` measures them), whether the replicas ended identical (the
digests of every rank's final parameters), and the last line. Pure: tested on synthetic
results."""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass, field

from lab.experiments.run.result import RunResult, StepSeen

__all__ = ["RunSummary", "analyse", "link_bytes", "percentile"]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[k]


def _samples(text: str) -> list[tuple[float, int]]:
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3:
            try:
                out.append((float(parts[0]), int(parts[1])))
            except ValueError:
                continue  # a line cut short when the sampler was stopped
    return out


def _tx_at(samples: list[tuple[float, int]], t: float) -> int | None:
    """The counter at the last sample at or before ``t``."""
    best = None
    for ts, tx in samples:
        if ts <= t:
            best = tx
        else:
            break
    return best


def link_bytes(counters: dict[int, str], ends: list[float]) -> list[float]:
    """Bytes every node sent on eth0 between consecutive step ends (``ends``, sorted)."""
    per_node = [_samples(text) for text in counters.values()]
    out = []
    for a, b in itertools.pairwise(ends):
        total = 0.0
        for samples in per_node:
            ta, tb = _tx_at(samples, a), _tx_at(samples, b)
            if ta is None or tb is None:
                break
            total += tb - ta
        else:
            out.append(total)
    return out


@dataclass
class RunSummary:
    """Built from the result alone; the files, the console text and the page come from it."""

    result: RunResult
    job_steps: dict[int, float] = field(default_factory=dict)  # step -> slowest rank's ms
    per_rank: dict[int, list[StepSeen]] = field(default_factory=dict)
    median_ms: float | None = None
    p90_ms: float | None = None
    step_bytes: dict[int, float] = field(default_factory=dict)  # step -> bytes on the link
    mb_per_step: float | None = None
    identical: bool | None = None  # None: not every rank left a digest

    @property
    def steps(self) -> int:
        return len(self.job_steps)

    @property
    def ok(self) -> bool:
        return self.result.diagnosis is None and self.result.clean

    @property
    def broken(self) -> str:
        if self.result.diagnosis is not None:
            return f"diagnosis: {self.result.diagnosis}"
        if not self.result.clean:
            codes = ", ".join(f"node{n} {c}" for n, c in sorted(self.result.exits.items()))
            return f"the job did not end cleanly: torchrun's exit codes {codes or 'none'}"
        return ""

    def replicas(self) -> str:
        if self.identical is None:
            n = len(self.result.digests)
            world = self.result.plan.layout.world_size
            return f"no parameter digest from {world - n} of {world} ranks"
        return "replicas identical at the end" if self.identical else "replicas DIFFER at the end"

    def headline(self) -> str:
        """``run: 4 ranks on 2 nodes, 5 ms between nodes; 120 steps, median 84.2 ms (p90
        91.0); 2.7 MB/step on the link; replicas identical at the end``."""
        plan = self.result.plan
        world = plan.layout.world_size
        parts = [f"run: {world} ranks on {plan.nodes} nodes, {plan.link_text()}"]
        if self.median_ms is not None and self.p90_ms is not None:
            parts.append(
                f"{self.steps} steps, median {self.median_ms:.1f} ms (p90 {self.p90_ms:.1f})"
            )
        else:
            parts.append("no step records" if plan.instrument else "not instrumented")
        if self.mb_per_step is not None:
            parts.append(f"{self.mb_per_step:.1f} MB/step on the link")
        if self.result.diagnosis is None:
            parts.append(self.replicas() if plan.instrument else self._exits())
        else:
            parts.append(self._exits())
        return "; ".join(parts)

    def _exits(self) -> str:
        codes = self.result.exits
        if codes and all(c == 0 for c in codes.values()) and not self.result.running:
            return "every node's torchrun exited 0"
        return "torchrun's exits: " + (
            ", ".join(f"node{n} {c}" for n, c in sorted(codes.items())) or "none"
        )

    def lines(self) -> list[str]:
        """The console's closing lines: the headline, then the diagnosis last, if any."""
        out = [self.headline()]
        if self.result.diagnosis is not None:
            out.append(f"diagnosis: {self.result.diagnosis}")
        return out


def analyse(result: RunResult) -> RunSummary:
    s = RunSummary(result)
    for seen in result.steps:
        s.per_rank.setdefault(seen.rank, []).append(seen)
        s.job_steps[seen.step] = max(seen.step_ms, s.job_steps.get(seen.step, seen.step_ms))
    timed = [ms for step, ms in sorted(s.job_steps.items()) if step > 1] or list(
        s.job_steps.values()
    )  # the first step holds gloo's connection set-up
    if timed:
        s.median_ms, s.p90_ms = statistics.median(timed), percentile(timed, 90)
    lead = sorted(s.per_rank.get(0, []), key=lambda x: x.step)
    every = len(result.counters) == result.plan.nodes  # a node not read: no total to give
    if every and len(lead) >= 2:
        per = link_bytes(result.counters, [x.t for x in lead])
        s.step_bytes = {x.step: b for x, b in zip(lead[1:], per, strict=False)}
        if s.step_bytes:
            s.mb_per_step = statistics.median(s.step_bytes.values()) / 1e6
    world = result.plan.layout.world_size
    if len(result.digests) >= world:
        s.identical = len(set(result.digests.values())) == 1
    return s
