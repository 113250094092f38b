"""What ``lab latency`` runs on one link: its configurations (bucket cap, overlap, gradient
accumulation, or the no-sync floor) and the phase that groups them with a link and a workload.

A single-phase sweep (explicit ``--caps``, ``--rate-mbit``, ``--model``, ...) runs every cap with
overlap on and off on one link per delay, as it always did. The default runs two phases per
delay, because no one workload on a 2-core host shows both lessons strongly
(docs/experiments/latency.md, "Why this default"): bucketing pays where allreduces are
latency-bound (an unshaped-rate link, a short backward), overlap where they are bandwidth-bound
and serial and backward is as long as they are (a rate cap, a long backward). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ddp.torchfree import TrainConfig

__all__ = [
    "ACCUMULATE",
    "AUTO",
    "BANDWIDTH_BACKWARD_MS",
    "PHASE_BATCH",
    "WORKLOAD",
    "Configuration",
    "Phase",
    "default_phases",
    "sweep_configurations",
]

# Both phases' global batch: the tower's real backward is then short (tens of ms), so in the
# latency-bound phase 82 per-parameter allreduces of ~25 ms each (two in flight) make the step,
# and a few buckets hardly add to it.
PHASE_BATCH = 16
# The bandwidth-bound phase's modelled accelerator backward (--backward-ms: a sleep spread over
# the gradients, which leaves the CPU to the communication): about as long as the 1.1 MB take
# at 20 Mbit/s (~470 ms, 7 buckets after backward). With real CPU compute instead (batch 768
# or 2048, backward 0.6-1.7 s on this host) the steps of one job varied 2x and overlap came out
# 0.8-0.9x: computation and communication share the two cores (docs/experiments/latency.md).
BANDWIDTH_BACKWARD_MS = 500.0
# The accumulation row's micro-batches per optimizer step.
ACCUMULATE = 4
AUTO = "auto"

WORKLOAD = (
    "The default runs two phases at each delay, because no one workload on a 2-core host shows "
    "both lessons strongly. Both train model tower (40 thin convolutions over the 32 features "
    "read as a signal: 82 tensors, 1.1 MB of gradients) on 2 nodes, one core and one thread "
    "per rank. The latency-bound phase (no rate cap, global batch "
    f"{PHASE_BATCH}: backward is short) runs per-parameter allreduce, caps 0.15 and 25 and "
    f"the auto cap with overlap on, and per-parameter with --accumulate {ACCUMULATE}: 82 "
    "allreduces of ~25 ms each make the step, a few buckets cost little (the bucketing "
    "lesson), and accumulation pays the 82 once per 4 micro-batches. The bandwidth-bound phase "
    f"(--rate-mbit, the same batch plus {BANDWIDTH_BACKWARD_MS:g} ms of modelled accelerator "
    "backward, as --backward-ms, against ~470 ms of allreduce) runs "
    "cap 0.15 (7 buckets, the first filling after 1/6 of backward) with overlap on and off, and "
    "the auto cap: overlap hides an allreduce only behind the backward that runs after its "
    "bucket filled, so backward must last about as long as the communication, and the "
    "communication must be bandwidth-bound and serial, or overlap off merges everything into "
    "one latency-bound allreduce and loses nothing (the overlap lesson). Any of --caps, "
    "--rate-mbit, --model, --batch-size, --backward-ms, --timeline-cap, --overlap (set to other "
    "than the default) makes it one phase of every cap with overlap on and off (or as --overlap "
    "says). Why: "
    "docs/experiments/latency.md, 'Why this default'."
)


@dataclass(frozen=True)
class Configuration:
    """One configuration: a bucket cap (MB, or "auto": the wrapper times the link at the
    rebuild and picks one), overlap and micro-batches per step; or (cap None) the floor."""

    cap_mb: float | str | None
    overlap: bool | None = None
    accumulate: int = 1

    @property
    def is_floor(self) -> bool:
        return self.cap_mb is None

    @property
    def is_auto(self) -> bool:
        return self.cap_mb == AUTO

    @property
    def name(self) -> str:
        """File-safe: part of the configuration's job name (its directory in the run)."""
        if self.cap_mb is None:
            return "nosync"
        cap = AUTO if self.is_auto else f"{self.cap_mb:g}"
        acc = f"-acc{self.accumulate}" if self.accumulate > 1 else ""
        return f"cap{cap}-{'overlap' if self.overlap else 'nooverlap'}{acc}"

    @property
    def label(self) -> str:
        if self.cap_mb is None:
            return "no sync (floor)"
        if self.is_auto:
            what = "auto cap"
        else:
            what = "per-parameter" if self.cap_mb == 0 else f"cap {self.cap_mb:g} MB"
        acc = f", accumulate {self.accumulate}" if self.accumulate > 1 else ""
        return f"{what}, overlap {'on' if self.overlap else 'off'}{acc}"

    def train_config(self, base: TrainConfig) -> TrainConfig:
        """``base`` with this configuration's fields. The floor keeps the simulated backward
        compute too, so exposed communication stays step time minus floor."""
        if self.cap_mb is None:
            return base.replace(sync="none")
        return base.replace(
            bucket_cap_mb=self.cap_mb, overlap=bool(self.overlap), accumulate=self.accumulate
        )


def sweep_configurations(
    caps: Sequence[float | str], overlaps: Sequence[bool] = (True, False)
) -> tuple[Configuration, ...]:
    """The floor, then per cap (a number of MB, or "auto") overlap on and off (adjacent, so
    slow drift of the shared host's load hits both alike), or only the ``overlaps`` given."""
    confs = [Configuration(None)]
    for cap in caps:
        confs += [Configuration(cap, overlap) for overlap in overlaps]
    return tuple(confs)


@dataclass(frozen=True)
class Phase:
    """One link (delay, rate cap) and workload, and the configurations run on it."""

    ms: float
    rate_mbit: float | None
    train: TrainConfig
    configurations: tuple[Configuration, ...]
    key: str = ""  # "" in a single-phase sweep; else part of every job name
    title: str = ""  # e.g. "latency-bound"
    lesson: str = ""  # what the phase shows and why

    @property
    def link_text(self) -> str:
        rate = f"rate {self.rate_mbit:g} Mbit/s" if self.rate_mbit else "no rate cap"
        return f"{self.ms:g} ms one-way, {rate}"

    @property
    def intro(self) -> str:
        """The phase's first line: its link, workload and lesson ('' in a single phase)."""
        if not self.key:
            return ""
        t = self.train
        modelled = (
            f", {t.backward_delay_ms:g} ms of modelled accelerator backward"
            if t.backward_delay_ms
            else ""
        )
        return (
            f"{self.title} phase ({self.link_text}, model {t.model}, global batch "
            f"{t.batch_size}{modelled}): {self.lesson}"
        )


_LATENCY_LESSON = (
    "shows bucketing: every allreduce pays the link's round trips whatever its size and "
    "backward is short, so 82 per-parameter allreduces make the step and a few buckets "
    "cost little; accumulation pays the same 82 once per 4 micro-batches"
)
_BANDWIDTH_LESSON = (
    "shows overlap: at the rate cap the 1.1 MB of gradients take about as long as backward, "
    "so buckets launched while backward runs hide behind it, and the same buckets sent after "
    "backward queue on the link; backward is a model of accelerator compute (a sleep), so "
    "it does not take the CPU the communication needs"
)


def default_phases(ms: float, train: TrainConfig, rate_mbit: float | None) -> tuple[Phase, ...]:
    """At ``ms``, both at global batch ``PHASE_BATCH``: the latency-bound phase (no rate cap:
    per-parameter vs bucketed, the auto cap, accumulation) and the bandwidth-bound phase
    (``rate_mbit`` and ``BANDWIDTH_BACKWARD_MS`` of modelled backward: one cap with overlap on
    and off, the auto cap)."""
    on = [Configuration(0.0, True), Configuration(0.15, True), Configuration(25.0, True)]
    latency = (
        Configuration(None),
        *on,
        Configuration(AUTO, True),
        Configuration(0.0, True, ACCUMULATE),
    )
    bandwidth = (
        Configuration(None),
        Configuration(0.15, True),
        Configuration(0.15, False),
        Configuration(AUTO, True),
    )
    small = train.replace(batch_size=PHASE_BATCH)
    modelled = small.replace(backward_delay_ms=BANDWIDTH_BACKWARD_MS)
    return (
        Phase(ms, None, small, latency, "latency", "latency-bound", _LATENCY_LESSON),
        Phase(
            ms, rate_mbit, modelled, bandwidth, "bandwidth", "bandwidth-bound", _BANDWIDTH_LESSON
        ),
    )
