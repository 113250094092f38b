"""What ``lab straggler`` prints, from the run's summary: the per-rank table beside the
baseline, and the closing line. Pure."""

from __future__ import annotations

from lab.experiments.straggler.analysis import Figures, StragglerSummary
from lab.report.report import Closing

__all__ = ["closing", "format_table", "headline_line"]


def format_table(s: Figures) -> str:
    """Per rank, slowed job beside the unslowed baseline (medians, ms)."""
    header = (
        f"{'rank':<12}{'compute ms':>12}{'waiting ms':>12}{'step ms':>10}"
        f"{'baseline step ms':>18}{'vs baseline':>13}{'baseline compute ms':>21}"
    )
    lines = [header]
    for r in s.rows:
        name = f"{r.rank} (slow)" if r.straggler else str(r.rank)
        lines.append(
            f"{name:<12}{r.compute_ms:>12.1f}{r.waiting_ms:>12.1f}{r.step_ms:>10.1f}"
            f"{r.baseline_step_ms:>18.1f}{r.vs_baseline:>12.2f}x{r.baseline_compute_ms:>21.1f}"
        )
    lines.append(
        f"{'job step':<12}{'':>34}{s.job_step_ms:>10.1f}{s.baseline_job_step_ms:>18.1f}"
        f"{s.job_x:>12.2f}x"
    )
    return "\n".join(lines)


def headline_line(s: Figures, straggler: int, cpu: bool = True) -> str:
    """The closing line. ``cpu``: the straggler was slowed by a CPU quota (its compute is what
    changed); else only by its link (what changed is everyone's waiting)."""
    what = f"its compute {s.straggler_compute_x:.1f}x slower" if cpu else "its link slower"
    return (
        f"straggler rank {straggler}: {what}, every rank's step {s.job_x:.1f}x "
        f"({s.baseline_job_step_ms:.1f} -> {s.job_step_ms:.1f} ms); "
        f"the others wait {s.others_waiting_ms:.1f} ms per step in allreduce"
    )


def closing(summary: StragglerSummary) -> Closing:
    """The table, then (after the 'took' line and what broke) the headline."""
    plan, figures = summary.result.plan, summary.figures
    return Closing(
        [f"{plan.describe()}; medians over the measured steps:", format_table(figures)],
        [headline_line(figures, plan.rank, cpu=plan.quota is not None)],
    )
