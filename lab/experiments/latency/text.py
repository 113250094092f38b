"""What ``lab latency`` prints: the progress line of a finished configuration, the table (a
block per delay and phase, a phase's block led by what it shows and why), the per-bucket
timings, the per-cap overlap line, the auto cap's and accumulation's lines (:mod:`.findings`)
and the headline; and the definitions of every figure (also written to ``latency.json`` and
shown in ``--help``). Pure."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lab.experiments.latency.analysis import Row, phase_groups
from lab.experiments.latency.bucket_stats import format_timing
from lab.experiments.latency.findings import accumulation_line, auto_cap_lines
from lab.experiments.latency.result import ConfigRun, SweepResult
from lab.experiments.reporting import Closing

if TYPE_CHECKING:
    from lab.experiments.latency.outputs import Outputs

__all__ = [
    "DEFINITIONS",
    "Headline",
    "closing",
    "describe",
    "format_table",
    "headline",
    "headline_line",
    "overlap_by_cap_line",
]

DEFINITIONS = {
    "median step time": (
        "for every measured step (warm-up steps excluded: they include gloo's connection "
        "set-up) the slowest rank's step_ms, since the job waits for it; then the median "
        "over steps"
    ),
    "exposed communication": (
        "median step time minus that of the no-sync floor at the same link delay (same steps, "
        "same data, no communication): what communication adds to a step after any overlap"
    ),
    "speedup vs per-parameter": (
        "the per-parameter (cap 0) median step time per sample with the same overlap setting "
        "(in the same phase) divided by this configuration's"
    ),
    "comm ms/sample": (
        "the median communication wait (the slowest rank's wait for allreduces after "
        "backward) per sample of the optimizer step: accumulating K micro-batches "
        "divides it by about K"
    ),
    "bucketing speedup": (
        "the faster per-parameter configuration (overlap on or off) divided by the fastest "
        "bucketed one (any fixed cap > 0, overlap on or off), in the first phase that ran both "
        "(the default's latency-bound phase, where both have overlap on)"
    ),
    "overlap gain": (
        "the fastest configuration with overlap off divided by the fastest with overlap on, "
        "each over every fixed cap (per-parameter included), in the first phase that ran both "
        "(the default's bandwidth-bound phase): what overlap buys once the cap is tuned for "
        "each setting"
    ),
}


def describe(run: ConfigRun, done: int, total: int) -> str:
    """The line printed when one configuration finished."""
    parity = "" if run.parity is None else f"  parity {'holds' if run.parity else 'BROKEN'}"
    phase = f" {run.phase.title}" if run.phase_key and run.phase else ""
    return (
        f"[{done:>2}/{total}] {run.ms:g} ms{phase} round {run.round}  {run.conf.label:<27} "
        f"{run.stats.calls:>3} allreduce/step  median step {run.stats.median_step_ms:8.1f} ms"
        f"{parity}  ({run.seconds:.0f} s)"
    )


@dataclass(frozen=True)
class Headline:
    ms: float
    bucketing_speedup: float
    per_parameter: str  # the configurations each ratio compares
    best_bucketed: str
    overlap_gain: float
    best_no_overlap: str
    best_overlap: str


def _fastest(rows: list[Row]) -> Row | None:
    return min(rows, key=lambda r: r.median_step_ms, default=None)


def _ratio_in(
    groups: list[list[Row]], slow: Callable[[Row], bool], fast: Callable[[Row], bool]
) -> tuple[float, str, str]:
    """Fastest of ``slow``'s rows over fastest of ``fast``'s, in the first group with both."""
    for rows in groups:
        a, b = _fastest([r for r in rows if slow(r)]), _fastest([r for r in rows if fast(r)])
        if a and b:
            return a.median_step_ms / b.median_step_ms, a.config, b.config
    return math.nan, "-", "-"


def headline(rows: list[Row], ms: float) -> Headline:
    """The two ratios of the closing line at latency ``ms`` (NaN where a side was not run),
    each within one phase, over fixed caps without accumulation."""
    groups = [
        [r for r in g if not r.is_floor and not r.is_auto and r.accumulate == 1]
        for g in phase_groups(rows, ms)
    ]
    bucketing = _ratio_in(groups, lambda r: r.cap_mb == 0, lambda r: r.is_bucketed)
    overlap = _ratio_in(groups, lambda r: r.overlap is False, lambda r: r.overlap is True)
    return Headline(ms, *bucketing, *overlap)


def overlap_by_cap_line(rows: list[Row], ms: float) -> str:
    """Overlap's gain at each cap (overlap-off step time / overlap-on), at latency ``ms``: the
    headline compares the best of each side, this shows where overlap matters (small and
    medium buckets, whose allreduces can start while backward still runs)."""
    parts = []
    for group in phase_groups(rows, ms):
        fixed = [r for r in group if not r.is_floor and not r.is_auto and r.accumulate == 1]
        for cap in dict.fromkeys(r.cap_mb for r in fixed):
            on = [r for r in fixed if r.cap_mb == cap and r.overlap is True]
            off = [r for r in fixed if r.cap_mb == cap and r.overlap is False]
            if on and off:
                what = "per-parameter" if cap == 0 else f"{cap:g} MB"
                parts.append(f"{what} {off[0].median_step_ms / on[0].median_step_ms:.2f}x")
    return f"overlap gain per cap at {ms:g} ms: {', '.join(parts) or '-'}"


def headline_line(h: Headline) -> str:
    """The command's last line, in the exact form the issue asks for; a ratio whose sides were
    not both run (e.g. --caps without 0) says which side is missing instead of "nanx"."""
    bucketing = _ratio(h.bucketing_speedup, "n/a (--caps has no 0 or no bucketed cap)")
    overlap = _ratio(h.overlap_gain, "n/a (overlap on and off not both run)")
    return (
        f"bucketing speedup at {h.ms:g} ms: {bucketing} (per-parameter vs best bucketed), "
        f"overlap gain: {overlap}"
    )


def _ratio(value: float, missing: str) -> str:
    return missing if math.isnan(value) else f"{value:.1f}x"


def _num(value: float, fmt: str) -> str:
    return "-" if value is None or math.isnan(value) else format(value, fmt)


_COLUMNS = (
    ("allreduce/step", 15),
    ("samples/step", 14),
    ("median step ms", 16),
    ("exposed comm ms", 17),
    ("comm ms/sample", 16),
    ("speedup vs per-param", 22),
)


def _cells(r: Row) -> list[str]:
    speedup = _num(r.speedup_vs_per_parameter, ".1f")
    return [
        str(r.calls),
        str(r.samples or "-"),
        f"{r.median_step_ms:.1f}",
        _num(r.exposed_comm_ms, ".1f"),
        _num(r.comm_ms_per_sample, ".2f"),
        speedup + ("x" if speedup != "-" else ""),
    ]


def format_table(
    rows: list[Row],
    rate_mbit: float | None = None,
    backward_ms: float = 0.0,
    intros: Mapping[tuple[float, str], str] | None = None,
) -> str:
    """The console table, one block per latency value and phase; ``intros`` (by delay and
    phase key) leads a phase's block with its link, workload and what it shows."""
    rate = f", rate {rate_mbit:g} Mbit/s" if rate_mbit else ""
    if backward_ms:
        rate += f", simulated backward compute {backward_ms:g} ms/step"
    width = max([28, *(len(r.config) + 2 for r in rows)])
    header = f"{'configuration':<{width}}" + "".join(f"{h:>{w}}" for h, w in _COLUMNS)
    lines = []
    for block in dict.fromkeys((r.ms, r.phase) for r in rows):
        intro = (intros or {}).get(block)
        lines += [intro or f"link delay {block[0]:g} ms one-way{rate}:", header + "  parity"]
        for r in (r for r in rows if (r.ms, r.phase) == block):
            cells = "".join(f"{c:>{w}}" for c, (_, w) in zip(_cells(r), _COLUMNS, strict=True))
            lines.append(f"{r.config:<{width}}{cells}  {r.parity_text}")
    return "\n".join(lines)


def closing(result: SweepResult, out: Outputs) -> Closing:
    """The report: the table and the Gantt pair's bucket timings, then (after the 'took' line)
    what broke, overlap per cap, the auto cap's choice, accumulation's drop and the headline
    of every delay (the last line)."""
    plan = result.plan
    intros = {(p.ms, p.key): p.intro for p in plan.phases() if p.key}
    table = [format_table(out.rows, plan.rate_mbit, plan.train.backward_delay_ms, intros)]
    if out.timings:
        table.append(f"per bucket, round 1 at {out.timeline_ms:g} ms (the Gantt chart's pair):")
        table += [format_timing(timing) for timing in out.timings]
    broken = [r.config for r in out.rows if r.parity is False]
    after = []
    for h in out.headlines:
        after += [overlap_by_cap_line(out.rows, h.ms), *auto_cap_lines(out.rows, h.ms)]
        after += [line for line in [accumulation_line(out.rows, h.ms)] if line]
    return Closing(
        table,
        f"parity BROKEN in: {'; '.join(broken)}" if broken else "",
        after + [headline_line(h) for h in out.headlines],
    )
