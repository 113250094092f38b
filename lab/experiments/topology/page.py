"""``lab topology``'s page: the first layout's step times against torch's DDP and the limit as
the headline, a table per layout (step time, network cost, cross-node bytes measured on the
link, steps to recover, parity), the figure, every verified link and every rank's exit. From
the run's summary."""

from __future__ import annotations

import math

from ddp.torchfree import Section, Table
from lab.experiments.topology.analysis import TopologySummary
from lab.experiments.topology.text import cores_line, headline_line
from lab.report.common import figures_section
from lab.report.results import Results, sweep_results

__all__ = ["page"]

_HEADERS = (
    "configuration",
    "median step ms",
    "per round",
    "network ms",
    "net vs torch",
    "vs torch",
    "vs limit",
    "cross-node MB/step",
    "buckets",
    "max|dparam|",
    "recover",
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
    tables = []
    for t in summary.layouts:
        rows = [
            [
                r.title,
                r.median_step_ms,
                "/".join(f"{m:.0f}" for m in r.round_step_ms),
                _cell(r.network_ms),
                _cell(r.network_vs_torch),
                _cell(r.step_time_vs_torch),
                _cell(r.step_time_vs_limit),
                _cell(r.cross_mb_per_step),
                _cell(r.buckets),
                _cell(r.max_param_diff),
                "/".join("-" if n is None else str(n) for n in r.steps_to_recover) or "-",
                "holds" if r.parity else "BROKEN",
            ]
            for r in t.rows
        ]
        where = f"{t.title}, {plan.link_text} between nodes, model {plan.train.model}"
        caption = f"{where}, {plan.cap_text}; medians over the rounds; {cores_line(summary)}"
        tables.append(Table(_HEADERS, rows, caption))
    links = [[lk.layout, lk.what, lk.shaper, lk.line, lk.note] for lk in result.links]
    sections = [
        Section("Per layout and configuration", tables),
        figures_section(result.run_dir, [("topology.png", "step time per configuration")]),
        Section(
            "The link between the nodes, as the probe measured it",
            [Table(("layout", "when", "shaper", "probe", "note"), links)],
        ),
    ]
    lines = [headline_line(t.rows, plan, t.title) for t in summary.layouts]
    figure = lines[0].split(": ", 1)[-1] if lines else "-"
    headline = (summary.broken, "parity holds in every job", figure)
    several = len(summary.layouts) > 1
    configs = {
        f"{r.label} ({r.layout})" if several else r.label: r.median_step_ms for r in summary.rows
    }
    ranks = {r.job: r.codes for r in result.runs}
    return sweep_results("topology", result, sections, ranks, headline, configs, _FILES)
