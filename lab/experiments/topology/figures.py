"""``topology.png``: the median step time of every configuration, each round's median as a
dot beside it, torch's DDP as the dashed reference. Pure (matplotlib's Agg backend)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from lab.experiments.topology.analysis import Row

__all__ = ["plot_step_times"]


def plot_step_times(path: Path, rows: Sequence[Row], title: str) -> None:
    """Bars: median step time per configuration (its ratio to torch's above it); dots: the
    rounds' own medians, which show how far the host's load moved the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=110)
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
    if rows and rows[0].config == "torch":
        ax.axhline(rows[0].median_step_ms, color="black", linestyle="--", linewidth=0.8)
    ax.set_xticks(list(xs), [r.label for r in rows])
    ax.set_ylabel("median step time (ms); dots: per round")
    ax.set_title(f"{title}\nstep time vs torch DDP (ratio above each bar)", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
