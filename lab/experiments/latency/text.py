"""What ``lab latency`` prints: the progress line of a finished configuration, and from the
sweep's summary the table (a block per delay and phase, a phase's block led by what it shows
and why), the per-bucket timings, the per-cap overlap line, the auto cap's and accumulation's
lines and the headline. Pure.

The auto cap (``bucket_cap_mb="auto"``) is chosen by the wrapper at the bucket rebuild, from a
timing of the link and of the last backward, so it may differ from round to round: every
round's choice is shown. Accumulating K micro-batches per optimizer step sends the same
allreduces once per K x batch samples: the communication wait per sample should fall about
K-fold while parity still holds against one process on the whole K x batch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from lab.experiments.latency.analysis import Headline, LatencySummary, Row, phase_groups
from lab.experiments.latency.bucket_stats import format_timing
from lab.experiments.latency.result import ConfigRun
from lab.report.report import Closing
from lab.words import count

__all__ = [
    "accumulation_line",
    "auto_cap_lines",
    "change_lines",
    "closing",
    "describe",
    "format_table",
    "headline_line",
    "overlap_by_cap_line",
]


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


def _fastest_fixed(rows: Sequence[Row], overlap: bool | None) -> Row | None:
    fixed = [r for r in rows if r.is_bucketed or r.cap_mb == 0]
    fixed = [r for r in fixed if r.accumulate == 1 and r.overlap is overlap]
    return min(fixed, key=lambda r: r.median_step_ms, default=None)


def _caps(caps: Sequence[float]) -> str:
    return ", ".join(f"{cap:g} MB (round {i})" for i, cap in enumerate(caps, 1)) or "nothing"


def auto_cap_lines(rows: Sequence[Row], ms: float) -> list[str]:
    """Per phase with an auto cap row at ``ms``: the cap chosen in every round, its
    allreduces per step, and its step time against the fastest fixed cap's (same overlap)."""
    lines = []
    for group in phase_groups(rows, ms):
        for auto in (r for r in group if r.is_auto):
            where = f", {auto.phase}-bound phase" if auto.phase else ""
            best = _fastest_fixed(group, auto.overlap)
            versus = "no fixed cap ran beside it"
            if best is not None:
                versus = (
                    f"step {auto.median_step_ms / best.median_step_ms:.2f}x the fastest fixed "
                    f"cap's ({best.config}: {best.median_step_ms:.1f} ms)"
                )
            lines.append(
                f"auto cap at {ms:g} ms{where}: chose {_caps(auto.auto_caps)}, "
                f"{count(auto.calls, 'allreduce')}/step, median step "
                f"{auto.median_step_ms:.1f} ms, {versus}"
            )
    return lines


def accumulation_line(rows: Sequence[Row], ms: float) -> str:
    """Communication per sample with K micro-batches per step against the same configuration
    without accumulation, at ``ms`` ('' when no accumulation row ran beside its base)."""
    for group in phase_groups(rows, ms):
        for acc in (r for r in group if r.accumulate > 1 and not r.is_floor):
            base = next(
                (
                    r
                    for r in group
                    if r.accumulate == 1 and (r.cap_mb, r.overlap) == (acc.cap_mb, acc.overlap)
                ),
                None,
            )
            if base is None or not (base.samples and acc.samples and acc.median_comm_ms > 0):
                continue
            drop = base.comm_ms_per_sample / acc.comm_ms_per_sample
            calls = (base.calls / base.samples) / (acc.calls / acc.samples)
            return (
                f"accumulation at {ms:g} ms: communication per sample {drop:.1f}x lower with "
                f"accumulate {acc.accumulate} ({base.config}: {base.calls} allreduces per "
                f"{base.samples} -> {acc.samples} samples, {calls:.1f}x fewer per sample; comm "
                f"wait {base.median_comm_ms:.1f} -> {acc.median_comm_ms:.1f} ms per step, "
                f"{base.comm_ms_per_sample:.2f} -> {acc.comm_ms_per_sample:.2f} ms per sample)"
            )
    return ""


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


def change_lines(runs: Sequence[ConfigRun]) -> list[str]:
    """With ``--change-at-step``: per configuration, the steps around the change in every
    round (the step it took effect at, the medians before and after, the steps to recover;
    :mod:`lab.experiments.link_change` defines them)."""
    changed = [r for r in runs if r.change is not None and r.recovery is not None]
    if not changed:
        return []
    first = changed[0].change
    assert first is not None
    to = f"{first.to_ms:g} ms" + (f", {first.to_rate_mbit:g} Mbit/s" if first.to_rate_mbit else "")
    lines = [
        f"link change to {to} at step {first.asked_step} (steps to recover: from the first "
        "step on the new link until every step stays within 10% of the median of the last 5):"
    ]
    for run in changed:
        rec = run.recovery
        assert rec is not None and run.change is not None
        off = "; probe NOT as asked" if run.change.mismatch else ""
        recover = "never settled" if rec.steps_to_recover is None else rec.steps_to_recover
        lines.append(
            f"  {run.job}: in place from step {rec.effective_step}, median before "
            f"{_num(rec.before_ms, '.1f')} ms, after {_num(rec.after_ms, '.1f')} ms, steps to "
            f"recover {recover}{off}"
        )
    return lines


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
    table += change_lines(summary.result.runs)
    after = []
    for h in summary.headlines:
        after += [overlap_by_cap_line(rows, h.ms), *auto_cap_lines(rows, h.ms)]
        after += [line for line in [accumulation_line(rows, h.ms)] if line]
    return Closing(table, after + [headline_line(h) for h in summary.headlines])
