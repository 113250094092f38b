"""``lab topology``'s page: every configuration's step time against torch's DDP as the
headline, the table (step time, cross-node bytes measured on the link, parity), the figure,
the verified link and every rank's exit. From the run's summary."""

from __future__ import annotations

import math

from ddp.torchfree import Section, Table
from lab.experiments.topology.analysis import TopologySummary
from lab.experiments.topology.text import headline_line
from lab.report.common import figures_section
from lab.report.results import Results, sweep_results

__all__ = ["page"]

_HEADERS = (
    "configuration",
    "median step ms",
    "per round",
    "cross-node MB/step",
    "buckets",
    "speedup vs torch",
    "max|dparam|",
    "parity",
)
_FILES = [
    ("topology.txt", "the table and the headline"),
    ("topology.csv", "the table"),
    ("topology.json", "settings, definitions, the link, every job"),
]


def _cell(value: float | None) -> object:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else value


def page(summary: TopologySummary) -> Results:
    """The page and the run's summary.json fields."""
    result = summary.result
    plan = result.plan
    rows = [
        [
            r.label,
            r.median_step_ms,
            "/".join(f"{m:.0f}" for m in r.round_step_ms),
            _cell(r.cross_mb_per_step),
            _cell(r.buckets),
            _cell(r.speedup_vs_torch),
            _cell(r.max_param_diff),
            "holds" if r.parity else "BROKEN",
        ]
        for r in summary.rows
    ]
    links = [[lk.shaper, lk.line, lk.note] for lk in result.links]
    where = f"{plan.layout.describe()}, {plan.link_text} between nodes, model {plan.train.model}"
    sections = [
        Section(
            "Per configuration",
            [
                Table(
                    _HEADERS,
                    rows,
                    f"{where}; medians over the rounds; "
                    "cross-node bytes from each node's eth0 counters",
                )
            ],
        ),
        figures_section(result.run_dir, [("topology.png", "step time per configuration")]),
        Section(
            "The link between the nodes, as the probe measured it",
            [Table(("shaper", "probe", "note"), links)],
        ),
    ]
    figure = headline_line(summary.rows, plan).split(": ", 1)[-1]
    headline = (summary.broken, "parity holds in every job", figure)
    configs = {r.label: r.median_step_ms for r in summary.rows}
    ranks = {r.job: r.codes for r in result.runs}
    return sweep_results("topology", result, sections, ranks, headline, configs, _FILES)
