"""``lab memory``'s page: the headline (what sharding saves, what it moves, what it costs, and
the limit DDP with Adam dies under while the sharded run fits), the per-rank table, the limited
jobs' outcome and every rank's exit. From the run's summary."""

from __future__ import annotations

import math

from ddp.torchfree import Section, Table, Text
from lab.experiments.memory.analysis import MemorySummary
from lab.experiments.memory.text import HEADERS, headline_line
from lab.report.results import Results, sweep_results

__all__ = ["page"]

_FILES = [
    ("memory.csv", "the per-rank table"),
    ("memory.txt", "the table and the limit's outcome, as printed"),
    ("memory.json", "settings, definitions, every figure, the limit"),
]


def _cell(v: float | None) -> object:
    return "" if v is None or not math.isfinite(v) else round(v, 1)


def page(summary: MemorySummary) -> Results:
    """The page and the run's summary.json fields."""
    result, plan = summary.result, summary.result.plan
    rows = []
    for job in summary.jobs.values():
        for r in job.rows:
            rows.append(
                [
                    job.label,
                    r.rank,
                    _cell(r.peak_rss_mib),
                    _cell(r.node_peak_mib),
                    _cell(r.optimizer_state_mb),
                    _cell(r.link_mb_per_step),
                    _cell(r.step_ms),
                ]
            )
        rows.append(
            [job.label, "job", "", "", "", _cell(job.link_mb_per_step), _cell(job.job_step_ms)]
        )
    limit = (
        summary.limit.lines()
        if summary.limit is not None
        else [result.limit_error or "no memory-limit run (--no-limit)"]
    )
    sections = [
        Section(
            "Per rank: memory, optimizer state, link bytes, step time",
            [
                Table(HEADERS, rows, f"{plan.describe()}; medians over the measured steps"),
                Text([headline_line(summary)]),
            ],
        ),
        Section("Under a memory limit", [Text(limit, pre=True)]),
    ]
    x = summary.ratios
    figure = (
        f"optimizer state {x.state_x:.2f}x per rank, link bytes {x.link_x:.2f}x DDP "
        f"at {plan.nodes} ranks"
    )
    held = "parity holds; DDP+Adam killed for memory where the sharded run fits"
    if not plan.limit:
        held = "parity holds in every job"
    headline = (summary.broken, held, figure)
    configs = {n: j.job_step_ms for n, j in summary.jobs.items()}
    ranks = {n: j.codes for n, j in result.jobs.items()}
    return sweep_results("memory", result, sections, ranks, headline, configs, _FILES)
