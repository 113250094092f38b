"""What ``lab latency`` prints: the progress line of a finished configuration, and from the
sweep's summary the table (a block per delay and phase, a phase's block led by what it shows
and why), the per-bucket timings, the per-cap overlap line, the auto cap's and accumulation's
lines (:mod:`.findings`) and the headline. Pure."""

from __future__ import annotations

import math
from collections.abc import Mapping

from lab.experiments.latency.analysis import Headline, LatencySummary, Row, phase_groups
from lab.experiments.latency.bucket_stats import format_timing
from lab.experiments.latency.findings import accumulation_line, auto_cap_lines
from lab.experiments.latency.result import ConfigRun
from lab.experiments.reporting import Closing

__all__ = ["closing", "describe", "format_table", "headline_line", "overlap_by_cap_line"]


def describe(run: ConfigRun, done: int, total: int) -> str:
    """The line printed when one configuration finished."""
    parity = "" if run.parity is None else f"  parity {'holds' if run.parity else 'BROKEN'}"
    phase = f" {run.phase.title}" if run.phase_key and run.phase else ""
    return (
        f"[{done:>2}/{total}] {run.ms:g} ms{phase} round {run.round}  {run.conf.label:<27} "
        f"{run.stats.calls:>3} allreduce/step  median step {run.stats.median_step_ms:8.1f} ms"
        f"{parity}  ({run.seconds:.0f} s)"
    )


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


def closing(summary: LatencySummary) -> Closing:
    """The table and the Gantt pair's bucket timings, then (after the 'took' line and what
    broke) overlap per cap, the auto cap's choice, accumulation's drop and the headline of
    every delay (the last line)."""
    plan, rows, gantt = summary.result.plan, summary.rows, summary.gantt
    intros = {(p.ms, p.key): p.intro for p in plan.phases() if p.key}
    table = [format_table(rows, plan.rate_mbit, plan.train.backward_delay_ms, intros)]
    if gantt.timings:
        table.append(f"per bucket, round 1 at {gantt.ms:g} ms (the Gantt chart's pair):")
        table += [format_timing(timing) for timing in gantt.timings]
    after = []
    for h in summary.headlines:
        after += [overlap_by_cap_line(rows, h.ms), *auto_cap_lines(rows, h.ms)]
        after += [line for line in [accumulation_line(rows, h.ms)] if line]
    return Closing(table, after + [headline_line(h) for h in summary.headlines])
