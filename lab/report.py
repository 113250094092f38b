"""The latency sweep's numbers: per-configuration statistics from collected rank logs, the
console table, the headline ratios, CSV/JSON files and the step-time plot.

Pure functions over the documented log format (``<dir>/rank<R>.jsonl``: a config record, step
records, an end record), so everything here is tested from synthetic logs without Docker.

The definitions of every figure are in :data:`DEFINITIONS` (also written to ``latency.json``).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DEFINITIONS",
    "ConfigStats",
    "Headline",
    "Row",
    "derive_rows",
    "format_table",
    "headline",
    "headline_line",
    "load_rank_logs",
    "overlap_by_cap_line",
    "plot_sweep",
    "summarize_config",
    "write_csv",
    "write_json",
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
        "the per-parameter (cap 0) median step time with the same overlap setting divided by "
        "this configuration's"
    ),
    "bucketing speedup": (
        "the faster per-parameter configuration (overlap on or off) divided by the fastest "
        "bucketed one (any cap > 0, overlap on or off)"
    ),
    "overlap gain": (
        "the fastest configuration with overlap off divided by the fastest with overlap on, "
        "each over every cap (per-parameter included): what overlap buys once the cap is "
        "tuned for each setting"
    ),
}


def load_rank_logs(log_dir: Path) -> dict[int, dict]:
    """``{rank: {"config": dict | None, "steps": [dict, ...], "end": dict | None}}``."""
    ranks: dict[int, dict] = {}
    for path in sorted(Path(log_dir).glob("rank*.jsonl")):
        rank = int(path.stem.removeprefix("rank"))
        entry: dict = {"config": None, "steps": [], "end": None}
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            record = json.loads(line)
            event = record.get("event")
            if event == "config":
                entry["config"] = record
            elif event == "step":
                entry["steps"].append(record)
            elif event == "end":
                entry["end"] = record
        ranks[rank] = entry
    return ranks


@dataclass(frozen=True)
class ConfigStats:
    """What one configuration's logs say, before comparing it with the others."""

    calls: int  # allreduce calls per step (the config record's num_buckets)
    median_step_ms: float
    median_comm_ms: float  # slowest rank's wait for allreduces after backward, median
    steps_measured: int


def summarize_config(log_dirs: str | Path | Sequence[Path], warmup: int) -> ConfigStats:
    """Statistics of one configuration, pooled over its runs (rounds) in ``log_dirs``; each
    run's first ``warmup`` steps are left out. ValueError if the logs cannot give them."""
    dirs = [Path(log_dirs)] if isinstance(log_dirs, str | Path) else [Path(d) for d in log_dirs]
    calls: set[int] = set()
    step_ms: list[float] = []
    comm_ms: list[float] = []
    for log_dir in dirs:
        ranks = load_rank_logs(log_dir)
        if not ranks:
            raise ValueError(f"no rank*.jsonl logs in {log_dir}")
        configs = [r["config"] for r in ranks.values()]
        if any(c is None for c in configs):
            raise ValueError(f"{log_dir}: a rank log has no config record")
        if any("num_buckets" not in c for c in configs):
            raise ValueError(
                f"{log_dir}: config records have no num_buckets; the image runs an older ddp, "
                "rebuild it with `python -m lab image`"
            )
        calls.update(int(c["num_buckets"]) for c in configs)
        by_step: dict[int, list[dict]] = {}
        for entry in ranks.values():
            for record in entry["steps"]:
                by_step.setdefault(record["step"], []).append(record)
        world = len(ranks)
        measured = sorted(s for s, recs in by_step.items() if s > warmup and len(recs) == world)
        if not measured:
            raise ValueError(
                f"{log_dir}: no step after the {warmup} warm-up steps was logged by all "
                f"{world} ranks; run more --steps"
            )
        step_ms += [max(r["step_ms"] for r in by_step[s]) for s in measured]
        comm_ms += [max(r["comm_ms"] for r in by_step[s]) for s in measured]
    assert len(calls) == 1, f"runs of one configuration disagree on allreduce calls: {calls}"
    return ConfigStats(
        calls=calls.pop(),
        median_step_ms=statistics.median(step_ms),
        median_comm_ms=statistics.median(comm_ms),
        steps_measured=len(step_ms),
    )


@dataclass(frozen=True)
class Row:
    """One line of the table / CSV. ``cap_mb`` and ``overlap`` are None for the no-sync floor;
    ``parity`` is None where it does not apply (no sync: replicas drift by design)."""

    ms: float
    config: str
    cap_mb: float | None
    overlap: bool | None
    calls: int
    median_step_ms: float
    median_comm_ms: float
    steps_measured: int
    parity: bool | None
    exposed_comm_ms: float = math.nan
    speedup_vs_per_parameter: float = math.nan

    @property
    def is_floor(self) -> bool:
        return self.cap_mb is None

    @property
    def parity_text(self) -> str:
        return "n/a (no sync)" if self.parity is None else ("holds" if self.parity else "BROKEN")


def derive_rows(rows: list[Row]) -> list[Row]:
    """Fill exposed communication and speedup vs per-parameter, per latency value."""
    out = []
    for row in rows:
        same_ms = [r for r in rows if r.ms == row.ms]
        floor = next((r for r in same_ms if r.is_floor), None)
        exposed = row.median_step_ms - floor.median_step_ms if floor else math.nan
        speedup = math.nan
        if not row.is_floor:
            base = next((r for r in same_ms if r.cap_mb == 0 and r.overlap == row.overlap), None)
            if base is not None:
                speedup = base.median_step_ms / row.median_step_ms
        out.append(
            dataclasses.replace(row, exposed_comm_ms=exposed, speedup_vs_per_parameter=speedup)
        )
    return out


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


def headline(rows: list[Row], ms: float) -> Headline:
    """The two ratios of the closing line at latency ``ms`` (NaN where a side was not run)."""
    runs = [r for r in rows if r.ms == ms and not r.is_floor]
    per_param = _fastest([r for r in runs if r.cap_mb == 0])
    bucketed = _fastest([r for r in runs if r.cap_mb])
    no_overlap = _fastest([r for r in runs if r.overlap is False])
    overlap = _fastest([r for r in runs if r.overlap is True])

    def ratio(a: Row | None, b: Row | None) -> float:
        return a.median_step_ms / b.median_step_ms if a and b else math.nan

    def name(r: Row | None) -> str:
        return r.config if r else "-"

    return Headline(
        ms,
        ratio(per_param, bucketed),
        name(per_param),
        name(bucketed),
        ratio(no_overlap, overlap),
        name(no_overlap),
        name(overlap),
    )


def overlap_by_cap_line(rows: list[Row], ms: float) -> str:
    """Overlap's gain at each cap (overlap-off step time / overlap-on), at latency ``ms``: the
    headline compares the best of each side, this shows where overlap matters (small and
    medium buckets, whose allreduces can start while backward still runs)."""
    parts = []
    for cap in dict.fromkeys(r.cap_mb for r in rows if r.ms == ms and not r.is_floor):
        on = [r for r in rows if r.ms == ms and r.cap_mb == cap and r.overlap is True]
        off = [r for r in rows if r.ms == ms and r.cap_mb == cap and r.overlap is False]
        if on and off:
            what = "per-parameter" if cap == 0 else f"{cap:g} MB"
            parts.append(f"{what} {off[0].median_step_ms / on[0].median_step_ms:.2f}x")
    return f"overlap gain per cap at {ms:g} ms: {', '.join(parts) or '-'}"


def headline_line(h: Headline) -> str:
    """The command's last line, in the exact form the issue asks for."""
    return (
        f"bucketing speedup at {h.ms:g} ms: {h.bucketing_speedup:.1f}x "
        f"(per-parameter vs best bucketed), overlap gain: {h.overlap_gain:.1f}x"
    )


def _num(value: float, fmt: str) -> str:
    return "-" if value is None or math.isnan(value) else format(value, fmt)


def format_table(rows: list[Row], rate_mbit: float | None = None, backward_ms: float = 0.0) -> str:
    """The console table, one block per latency value."""
    rate = f", rate {rate_mbit:g} Mbit/s" if rate_mbit else ""
    if backward_ms:
        rate += f", simulated backward compute {backward_ms:g} ms/step"
    header = (
        f"{'configuration':<28}{'allreduce/step':>15}{'median step ms':>16}"
        f"{'exposed comm ms':>17}{'speedup vs per-param':>22}  parity"
    )
    lines = []
    for ms in dict.fromkeys(r.ms for r in rows):
        lines += [f"link delay {ms:g} ms one-way{rate}:", header]
        for r in (r for r in rows if r.ms == ms):
            speedup = _num(r.speedup_vs_per_parameter, ".1f")
            lines.append(
                f"{r.config:<28}{r.calls:>15d}{r.median_step_ms:>16.1f}"
                f"{_num(r.exposed_comm_ms, '.1f'):>17}"
                f"{speedup + ('x' if speedup != '-' else ''):>22}  {r.parity_text}"
            )
    return "\n".join(lines)


def _blank(value: object) -> object:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _csv_row(r: Row) -> dict[str, object]:
    return {
        "ms": r.ms,
        "config": r.config,
        "bucket_cap_mb": _blank(r.cap_mb),
        "overlap": _blank(r.overlap),
        "allreduce_calls_per_step": r.calls,
        "median_step_ms": round(r.median_step_ms, 3),
        "exposed_comm_ms": _blank(round(r.exposed_comm_ms, 3)),
        "median_comm_wait_ms": round(r.median_comm_ms, 3),
        "speedup_vs_per_parameter": _blank(round(r.speedup_vs_per_parameter, 3)),
        "parity": r.parity_text,
        "steps_measured": r.steps_measured,
    }


def write_csv(path: Path, rows: list[Row]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(_csv_row(rows[0])) if rows else [])
        writer.writeheader()
        writer.writerows(_csv_row(r) for r in rows)


def _jsonable(value: object) -> object:
    # NaN is not JSON; null says "not measured" honestly.
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def write_json(path: Path, rows: list[Row], headlines: list[Headline], extra: dict) -> None:
    """``extra`` carries the run's settings, link measurements and file names."""
    doc = {
        **extra,
        "definitions": DEFINITIONS,
        "rows": [dataclasses.asdict(r) for r in rows],
        "headline": [dataclasses.asdict(h) for h in headlines],
    }
    path.write_text(json.dumps(_jsonable(doc), indent=2) + "\n")


def _cap_label(cap: float, calls: int | None) -> str:
    name = "per-param" if cap == 0 else f"{cap:g} MB"
    return name if calls is None else f"{name}\n({calls} calls)"


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
