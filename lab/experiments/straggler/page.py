"""``lab straggler``'s page: how much one slow rank slows every rank as the headline, the
per-rank split of each step into compute and waiting beside the baseline, the Gantt chart, the
slow link's probe and every rank's exit. From the run's summary."""

from __future__ import annotations

from ddp.torchfree import Section, Table, Text
from lab.experiments.straggler.analysis import StragglerSummary
from lab.experiments.straggler.plan import BASELINE_JOB, SLOWED_JOB
from lab.experiments.straggler.text import headline_line
from lab.report.common import figures_section
from lab.report.results import Results, sweep_results

__all__ = ["page"]

_HEADERS = (
    "rank",
    "compute ms",
    "waiting ms",
    "step ms",
    "baseline step ms",
    "vs baseline",
    "baseline compute ms",
    "baseline waiting ms",
)
_FILES = [
    ("straggler.csv", "the per-rank table"),
    ("straggler.json", "settings, definitions, every figure"),
    ("trace.json", "Chrome trace of one step of each job"),
]


def page(summary: StragglerSummary) -> Results:
    """The page and the run's summary.json fields."""
    result, s = summary.result, summary.figures
    plan = result.plan
    rows = [
        [
            f"{r.rank} (slow)" if r.straggler else r.rank,
            r.compute_ms,
            r.waiting_ms,
            r.step_ms,
            r.baseline_step_ms,
            f"{r.vs_baseline:.2f}x",
            r.baseline_compute_ms,
            r.baseline_waiting_ms,
        ]
        for r in s.rows
    ]
    rows.append(
        ["job step", "", "", s.job_step_ms, s.baseline_job_step_ms, f"{s.job_x:.2f}x", "", ""]
    )
    jobs = [BASELINE_JOB, SLOWED_JOB]
    sections = [
        Section(
            "Per rank, slowed vs the unslowed baseline",
            [
                Table(_HEADERS, rows, f"{plan.describe()}; medians over the measured steps"),
                Text([headline_line(s, plan.rank, cpu=plan.quota is not None)]),
            ],
        ),
        figures_section(
            result.run_dir,
            [
                (
                    "gantt.png",
                    "one step: unslowed above, slowed below; yellow after backward = waiting",
                )
            ],
        ),
        Section(
            "The slow link, as the probe measured it",
            [Text(result.link_lines or ["no link was shaped"], pre=True)],
        ),
    ]
    figure = f"every rank's step {s.job_x:.1f}x with rank {plan.rank} slowed"
    headline = (summary.broken, "parity holds in both jobs", figure)
    configs = {"baseline": s.baseline_job_step_ms, "slowed": s.job_step_ms}
    ranks = {j: result.jobs[j].codes for j in jobs if j in result.jobs}
    return sweep_results("straggler", result, sections, ranks, headline, configs, _FILES, jobs)
