"""The sweep's plot: median step time against bucket cap, one line per delay and overlap
setting, the no-sync floor dotted. Pure (matplotlib's Agg backend, no display)."""

from __future__ import annotations

from pathlib import Path

from lab.experiments.latency.analysis import Row
from lab.words import count

__all__ = ["plot_sweep"]


def _cap_label(cap: float, calls: int | None) -> str:
    name = "per-param" if cap == 0 else f"{cap:g} MB"
    return name if calls is None else f"{name}\n({count(calls, 'call')})"


def plot_sweep(path: Path, rows: list[Row]) -> None:
    """Median step time vs bucket cap: overlap on (solid) and off (dashed), one colour per
    latency value, the no-sync floor dotted. Caps sit at even spacing (cap 0 has no log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    caps = sorted({r.cap_mb for r in rows if not r.is_floor})
    x = {cap: i for i, cap in enumerate(caps)}
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for i, ms in enumerate(dict.fromkeys(r.ms for r in rows)):
        color = f"C{i}"
        for overlap, style in ((True, "-o"), (False, "--s")):
            pts = sorted(
                (x[r.cap_mb], r.median_step_ms) for r in rows if r.ms == ms and r.overlap is overlap
            )
            if pts:
                xs, ys = zip(*pts, strict=True)
                label = f"{ms:g} ms, overlap {'on' if overlap else 'off'}"
                ax.plot(xs, ys, style, color=color, label=label)
        floor = next((r for r in rows if r.ms == ms and r.is_floor), None)
        if floor is not None:
            ax.axhline(floor.median_step_ms, color=color, linestyle=":", linewidth=1)
            ax.annotate(
                f"no-sync floor {floor.median_step_ms:.1f} ms",
                (len(caps) - 1, floor.median_step_ms),
                textcoords="offset points",
                xytext=(0, 4),
                ha="right",
                fontsize=8,
                color=color,
            )
    calls = {r.cap_mb: r.calls for r in rows if not r.is_floor}
    ax.set_xticks(range(len(caps)), [_cap_label(c, calls.get(c)) for c in caps])
    ax.set_yscale("log")
    ax.set_xlabel("bucket cap (allreduce calls per step)")
    ax.set_ylabel("median step time (ms, log scale)")
    ax.set_title("Step time vs bucket cap under injected link latency")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
