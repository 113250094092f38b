"""The sweep's plot: median step time against bucket cap, one line per delay, phase and overlap
setting (the auto cap at the right end of its line), the no-sync floor dotted. Accumulation
rows are left out: their steps hold K times the samples. Pure (matplotlib's Agg backend, no
display)."""

from __future__ import annotations

from pathlib import Path

from lab.experiments.latency.analysis import Row
from lab.words import count

__all__ = ["plot_sweep"]


def _cap_label(cap: float | str, calls: int | None) -> str:
    name = "auto" if cap == "auto" else "per-param" if cap == 0 else f"{cap:g} MB"
    return name if calls is None else f"{name}\n({count(calls, 'call')})"


def _caps(rows: list[Row]) -> list[float | str]:
    """Fixed caps in order, then "auto" if it ran."""
    fixed = sorted({r.cap_mb for r in rows if isinstance(r.cap_mb, int | float)})
    return [*fixed, *(["auto"] if any(r.is_auto for r in rows) else [])]


def _label(ms: float, phase: str, overlap: bool) -> str:
    return f"{ms:g} ms{f', {phase}-bound' if phase else ''}, overlap {'on' if overlap else 'off'}"


def plot_sweep(path: Path, rows: list[Row]) -> None:
    """Median step time vs bucket cap: overlap on (solid) and off (dashed), one colour per
    latency value, the no-sync floor dotted. Caps sit at even spacing (cap 0 has no log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.accumulate == 1]
    caps = _caps([r for r in rows if not r.is_floor])
    x = {cap: i for i, cap in enumerate(caps)}
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for i, (ms, phase) in enumerate(dict.fromkeys((r.ms, r.phase) for r in rows)):
        color = f"C{i}"
        block = [r for r in rows if (r.ms, r.phase) == (ms, phase)]
        for overlap, style in ((True, "-o"), (False, "--s")):
            pts = sorted((x[r.cap_mb], r.median_step_ms) for r in block if r.overlap is overlap)
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, style, color=color, label=_label(ms, phase, overlap))
        floor = next((r for r in block if r.is_floor), None)
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
    calls = {r.cap_mb: r.calls for r in rows if not r.is_floor and not r.is_auto}
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
