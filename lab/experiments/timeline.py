"""One training step as a timeline: every rank's forward and backward and every bucket's
allreduce, as a Chrome trace JSON (Perfetto, chrome://tracing) and as a PNG Gantt chart.

Built from the ranks' step records (``ddp.program.records.StepRecord``): ``t0`` (wall clock at step
start, so ranks in different containers of one host share an axis), ``backward_ms``
``[start, end]`` and ``buckets_ms`` ``[[launch, done], ...]`` relative to the step's start.
``done`` is observed on gloo's thread when the allreduce really completes, so a bucket bar that
lies inside the backward bar is communication hidden behind computation. With overlap on a
bucket is launched when it fills, so the Gantt chart cuts each rank's backward bar at the
launches and labels the pieces: backward piece ``bk`` computed bucket k's gradients, and the
allreduce bar ``bk`` running under piece ``bk+1`` is bucket k travelling while backward
computes bucket k+1. Pure.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ddp.torchfree import RankLog, StepRecord

__all__ = [
    "RankStep",
    "StepTimeline",
    "backward_pieces",
    "chrome_trace",
    "load_step",
    "representative_step",
    "write_gantt",
]


@dataclass(frozen=True)
class RankStep:
    """One rank's step, in ms from the earliest rank's step start (``offset_ms`` is this rank's
    start on that axis; the other times are relative to this rank's own start)."""

    offset_ms: float
    backward_ms: tuple[float, float]
    buckets_ms: list[tuple[float, float]]
    step_ms: float


@dataclass(frozen=True)
class StepTimeline:
    title: str  # e.g. "cap 1 MB, overlap on"
    step: int
    ranks: dict[int, RankStep] = field(default_factory=dict)
    overlap: bool = False  # buckets launched when they filled: the launches cut backward

    @property
    def end_ms(self) -> float:
        return max(r.offset_ms + r.step_ms for r in self.ranks.values())


def _has_timeline(r: StepRecord) -> bool:
    return r.t0 is not None and r.backward_ms is not None and r.buckets_ms is not None


def representative_step(logs: Mapping[int, RankLog], warmup: int, where: str = "logs") -> int:
    """The measured step whose slowest-rank step time is closest to the median (not an outlier).

    Raises ValueError when no measured step carries a timeline on every rank (no-sync runs).
    """
    by_step: dict[int, list[StepRecord]] = {}
    for log in logs.values():
        for r in log.steps:
            if r.step > warmup and _has_timeline(r):
                by_step.setdefault(r.step, []).append(r)
    complete = {
        s: max(r.step_ms for r in recs) for s, recs in by_step.items() if len(recs) == len(logs)
    }
    if not complete:
        raise ValueError(f"{where}: no measured step with a timeline (t0, buckets_ms) on all ranks")
    median = statistics.median(complete.values())
    return min(complete, key=lambda s: (abs(complete[s] - median), s))


def load_step(
    logs: Mapping[int, RankLog], step: int, title: str, where: str = "logs", overlap: bool = False
) -> StepTimeline:
    """Every rank's timeline of ``step``, aligned on the earliest rank's start."""
    records: dict[int, StepRecord] = {}
    for rank, log in logs.items():
        found = [r for r in log.steps if r.step == step and _has_timeline(r)]
        if not found:
            raise ValueError(f"{where}: rank {rank} has no timeline for step {step}")
        records[rank] = found[0]
    start = min(r.t0 for r in records.values() if r.t0 is not None)
    ranks = {
        rank: RankStep(
            offset_ms=((r.t0 or 0.0) - start) * 1e3,
            backward_ms=(float(r.backward_ms[0]), float(r.backward_ms[1])),  # type: ignore[index]
            buckets_ms=[(float(a), float(b)) for a, b in r.buckets_ms or []],
            step_ms=float(r.step_ms),
        )
        for rank, r in sorted(records.items())
    }
    return StepTimeline(title, step, ranks, overlap)


def _lanes(intervals: list[tuple[float, float]]) -> list[int]:
    """Greedy lanes so that intervals in one lane never overlap (allreduces may be in flight
    together; a trace viewer needs properly nested slices per thread)."""
    ends: list[float] = []
    lanes = []
    for a, b in intervals:
        lane = next((i for i, end in enumerate(ends) if end <= a), len(ends))
        if lane == len(ends):
            ends.append(b)
        else:
            ends[lane] = b
        lanes.append(lane)
    return lanes


def _phases(r: RankStep) -> list[tuple[str, float, float]]:
    (bw0, bw1) = r.backward_ms
    return [
        ("forward", 0.0, bw0),
        ("backward", bw0, bw1),
        ("after backward: allreduce wait, optimizer", bw1, r.step_ms),
    ]


def backward_pieces(r: RankStep) -> list[tuple[str, float, float]]:
    """Backward cut at the bucket launches that fall inside it: ``("b<k>", start, end)``, the
    compute that filled bucket k (with overlap on; the last piece ends with backward)."""
    bw0, bw1 = r.backward_ms
    cuts = [a for a, _ in r.buckets_ms]
    pieces, start = [], bw0
    for k, cut in enumerate(cuts):
        end = bw1 if k == len(cuts) - 1 else min(max(cut, start), bw1)
        pieces.append((f"b{k}", start, end))
        start = end
    return pieces


def chrome_trace(timelines: list[StepTimeline]) -> dict:
    """Trace Event Format: one process per timeline, per rank a compute thread and as many
    allreduce threads as buckets were in flight at once. Times in microseconds."""
    events: list[dict] = []

    def meta(kind: str, pid: int, tid: int | None, **args: object) -> None:
        event = {"name": kind, "ph": "M", "pid": pid, "args": args}
        if tid is not None:
            event["tid"] = tid
        events.append(event)

    def span(name: str, pid: int, tid: int, a_ms: float, b_ms: float, **args: object) -> None:
        events.append(
            {
                "name": name,
                "ph": "X",
                "pid": pid,
                "tid": tid,
                "ts": a_ms * 1e3,
                "dur": max(b_ms - a_ms, 0.0) * 1e3,
                "args": args,
            }
        )

    for pid, tl in enumerate(timelines, start=1):
        meta("process_name", pid, None, name=f"{tl.title} (step {tl.step})")
        meta("process_sort_index", pid, None, sort_index=pid)
        for rank, r in tl.ranks.items():
            compute = rank * 100
            meta("thread_name", pid, compute, name=f"rank {rank} compute")
            meta("thread_sort_index", pid, compute, sort_index=compute)
            for name, a, b in _phases(r):
                span(name, pid, compute, r.offset_ms + a, r.offset_ms + b, rank=rank)
            for name, a, b in backward_pieces(r) if tl.overlap else ():
                span(f"backward {name}", pid, compute, r.offset_ms + a, r.offset_ms + b, rank=rank)
            lanes = _lanes(r.buckets_ms)
            for lane in sorted(set(lanes)):
                tid = compute + 1 + lane
                meta(
                    "thread_name",
                    pid,
                    tid,
                    name=f"rank {rank} allreduce" + (f" ({lane + 1})" if lane else ""),
                )
                meta("thread_sort_index", pid, tid, sort_index=tid)
            for k, ((a, b), lane) in enumerate(zip(r.buckets_ms, lanes, strict=True)):
                span(
                    f"allreduce bucket {k}",
                    pid,
                    compute + 1 + lane,
                    r.offset_ms + a,
                    r.offset_ms + b,
                    rank=rank,
                    bucket=k,
                    ms=round(b - a, 3),
                )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


_ALLREDUCE = "allreduce bk (launch to done, queueing in gloo included)"
_COLORS = {
    "forward": "#bdbdbd",
    "backward": "#3b75af",
    "backward (piece bk fills bucket k)": "#7fa7d4",
    "after backward: allreduce wait, optimizer": "#f2c14e",
    _ALLREDUCE: "#d1495b",
}


def _label(ax, text: str, x: float, width: float, y: float, end: float, color: str) -> None:
    """``text`` at the start of a bar (bars in flight together start apart), if it fits."""
    if width >= end * 0.018:
        ax.text(x + end * 0.003, y, text, ha="left", va="center", fontsize=6, color=color)


def write_gantt(path: Path, timelines: list[StepTimeline], suptitle: str = "") -> None:
    """One panel per timeline (e.g. overlap on above, off below) on a shared time axis; per
    rank the compute phases on top and the bucket allreduces (stacked lanes) underneath."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if not timelines:
        raise ValueError("no timelines to draw")
    fig, axes = plt.subplots(
        len(timelines),
        1,
        figsize=(11, 1.4 + 1.6 * sum(len(t.ranks) for t in timelines) / 2),
        dpi=110,
        sharex=True,
        squeeze=False,
    )
    end = max(t.end_ms for t in timelines)
    for ax, tl in zip(axes[:, 0], timelines, strict=True):
        ticks, labels = [], []
        for row, (rank, r) in enumerate(tl.ranks.items()):
            y = -row * 1.0  # rank 0 on top
            for name, a, b in _phases(r):
                ax.broken_barh([(r.offset_ms + a, b - a)], (y, 0.3), color=_COLORS[name])
            pieces = backward_pieces(r) if tl.overlap else []
            for k, (name, a, b) in enumerate(pieces):
                color = _COLORS["backward" if k % 2 else "backward (piece bk fills bucket k)"]
                ax.broken_barh([(r.offset_ms + a, b - a)], (y, 0.3), color=color)
                _label(ax, name, r.offset_ms + a, b - a, y + 0.15, end, "black")
            lanes = _lanes(r.buckets_ms)
            height = 0.62 / max(len(set(lanes)), 1)
            for k, ((a, b), lane) in enumerate(zip(r.buckets_ms, lanes, strict=True)):
                ax.broken_barh(
                    [(r.offset_ms + a, max(b - a, end * 0.002))],
                    (y - 0.66 + lane * height, height * 0.9),
                    color=_COLORS[_ALLREDUCE],
                    edgecolor="black",
                    linewidth=0.3,
                )
                _label(
                    ax,
                    f"b{k}",
                    r.offset_ms + a,
                    b - a,
                    y - 0.66 + (lane + 0.45) * height,
                    end,
                    "black",
                )
            ticks.append(y - 0.18)
            labels.append(f"rank {rank}")
        ax.set_yticks(ticks, labels)
        ax.set_title(f"{tl.title}: step {tl.step}, {tl.end_ms:.1f} ms", fontsize=10, loc="left")
        ax.grid(True, axis="x", alpha=0.3)
        ax.set_xlim(0, end * 1.02)
    axes[-1, 0].set_xlabel("ms since the first rank started the step")
    handles = [Patch(color=c, label=n) for n, c in _COLORS.items()]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, frameon=False)
    if suptitle:
        fig.suptitle(suptitle, fontsize=11)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path)
    plt.close(fig)
