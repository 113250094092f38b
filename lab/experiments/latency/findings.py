"""Two closing lines of ``lab latency`` beside the headline: what the auto cap chose and how it
did against the fixed caps, and how far gradient accumulation cut communication per sample.

The auto cap (``bucket_cap_mb="auto"``) is chosen by the wrapper at the bucket rebuild, from a
timing of the link and of the last backward, so it may differ from round to round: every
round's choice is shown. Accumulating K micro-batches per optimizer step sends the same
allreduces once per K x batch samples: the communication wait per sample should fall about
K-fold while parity still holds against one process on the whole K x batch. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from lab.experiments.latency.analysis import Row, phase_groups
from lab.words import count

__all__ = ["accumulation_line", "auto_cap_lines"]


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
