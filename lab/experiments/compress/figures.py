"""``compress.png``: step time and speedup vs rate per hook, and what each hook costs in final
loss and parameter distance. Pure (matplotlib's Agg backend, no display)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from lab.experiments.compress.analysis import Crossover, Row

__all__ = ["plot_compress"]


def _finite(rows: Sequence[Row], attr: str) -> list[Row]:
    return [r for r in rows if math.isfinite(getattr(r, attr))]


def plot_compress(path: Path, rows: Sequence[Row], cs: Sequence[Crossover], title: str) -> None:
    """Left: median step time vs rate (log-log), one line per hook. Middle: speedup vs none,
    the 1.0x line and each interpolated crossover marked. Right: per hook (at the lowest rate,
    round 1; the same at every rate) the final loss minus none's, and the max |param diff| vs
    the exact single process on a log axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hooks = list(dict.fromkeys(r.hook for r in rows))
    color = {h: f"C{i}" for i, h in enumerate(hooks)}
    fig, (ax_t, ax_s, ax_q) = plt.subplots(1, 3, figsize=(15, 4.8), dpi=100)
    for hook in hooks:
        pts = sorted((r.rate_mbit, r.median_step_ms) for r in rows if r.hook == hook)
        ax_t.plot(*zip(*pts, strict=True), "-o", color=color[hook], label=hook)
        sp = sorted(
            (r.rate_mbit, r.speedup_vs_none)
            for r in _finite(rows, "speedup_vs_none")
            if r.hook == hook
        )
        if sp and hook != "none":
            ax_s.plot(*zip(*sp, strict=True), "-o", color=color[hook], label=hook)
    for c in cs:
        for _, _, x in c.crossings:
            ax_s.axvline(x, color=color[c.hook], linestyle=":", linewidth=1)
            ax_s.annotate(
                f"{c.hook} ~{x:.0f}",
                (x, 1.0),
                textcoords="offset points",
                xytext=(-2, 6),
                fontsize=8,
                color=color[c.hook],
                rotation=90,
                ha="right",
                va="bottom",
            )
    for ax in (ax_t, ax_s):
        ax.set_xscale("log")
        ax.set_xlabel("link cap per node (Mbit/s, log scale)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("median step time (ms, log scale)")
    ax_t.set_title("step time vs bandwidth", fontsize=10)
    ax_s.set_yscale("log")
    ax_s.axhline(1.0, color="black", linewidth=0.8)
    ax_s.set_ylabel("speedup vs none (log; >1: compression pays)")
    ax_s.set_title("speedup vs none; dotted: interpolated crossover", fontsize=10)

    _plot_price(ax_q, rows, color)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _plot_price(ax_q, rows: Sequence[Row], color: dict[str, str]) -> None:
    """Per hook at the lowest rate: final loss minus none's (bars), max |param diff| vs the
    exact single process (dots, log axis on the right)."""
    lowest = min(r.rate_mbit for r in rows)
    at = [r for r in rows if r.rate_mbit == lowest]
    xs = range(len(at))
    ax_q.bar(
        xs,
        [0.0 if math.isnan(r.loss_vs_none) else r.loss_vs_none for r in at],
        color=[color[r.hook] for r in at],
    )
    ax_q.set_xticks(list(xs), [r.hook for r in at])
    ax_q.axhline(0.0, color="black", linewidth=0.8)
    ax_q.set_ylabel("final loss minus none's (bars)")
    ax_q.set_title("price: final loss (bars), max |param diff| vs exact (dots)", fontsize=10)
    ax_d = ax_q.twinx()
    diffs = [
        (i, r.max_param_diff)
        for i, r in enumerate(at)
        if math.isfinite(r.max_param_diff) and r.max_param_diff > 0
    ]
    if diffs:
        ax_d.plot(*zip(*diffs, strict=True), "kD", markersize=6)
        for i, d in diffs:
            ax_d.annotate(
                f"{d:.1e}",
                (i, d),
                textcoords="offset points",
                xytext=(6, 0),
                fontsize=8,
                va="center",
            )
        ax_d.set_yscale("log")
    ax_d.set_ylabel("max |param diff| vs exact single process (log)")
