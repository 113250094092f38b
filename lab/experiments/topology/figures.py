"""``topology.png``: per layout, the median step time of every configuration, each round's
median as a dot beside it, torch's DDP as the dashed reference and the limit as the dotted
floor. Pure (matplotlib's Agg backend)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from lab.experiments.topology.analysis import LayoutRows
from lab.experiments.topology.plan import BASELINE, LIMIT

__all__ = ["plot_step_times"]


def plot_step_times(path: Path, layouts: Sequence[LayoutRows], title: str) -> None:
    """One panel per layout. Bars: median step time per configuration (its ratio to torch's
    above it); dots: the rounds' own medians, which show how far the host's load moved the
    figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(1, len(layouts))
    fig, axes = plt.subplots(n, 1, figsize=(9, 4.2 * n), dpi=110, squeeze=False)
    for ax, table in zip(axes[:, 0], layouts, strict=False):
        rows = table.rows
        xs = range(len(rows))
        bars = ax.bar(xs, [r.median_step_ms for r in rows], color=[f"C{i}" for i in xs])
        for x, r, bar in zip(xs, rows, bars, strict=True):
            ax.plot([x] * len(r.round_step_ms), r.round_step_ms, "k.", markersize=6)
            if not math.isnan(r.step_time_vs_torch):
                ax.annotate(
                    f"{r.step_time_vs_torch:.2f}x",
                    (x, bar.get_height()),
                    ha="center",
                    textcoords="offset points",
                    xytext=(0, 4),
                    fontsize=9,
                )
        for name, style in ((BASELINE.name, "--"), (LIMIT.name, ":")):
            row = table.row(name)
            if row is not None:
                ax.axhline(row.median_step_ms, color="black", linestyle=style, linewidth=0.8)
        ax.set_xticks(list(xs), [r.label for r in rows], fontsize=8)
        ax.set_ylabel("median step ms; dots: rounds")
        ax.set_title(f"{table.title}: step time vs torch DDP (ratio above each bar)", fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
