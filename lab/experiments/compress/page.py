"""``lab compress``'s page: where each hook pays as the headline, the table per rate and hook,
the crossover, the figure, the verified links and every rank's exit. From the run's summary."""

from __future__ import annotations

from ddp.torchfree import Section, Table, Text
from lab.experiments.compress.analysis import CompressSummary, Crossover
from lab.experiments.compress.text import crossover_line
from lab.report.common import figures_section
from lab.report.results import Results, sweep_results

__all__ = ["page"]

_HEADERS = (
    "rate Mbit/s",
    "hook",
    "median step ms",
    "per round",
    "speedup vs none",
    "wire MB/step",
    "sent MB/job",
    "final loss",
    "vs exact",
    "vs none",
    "max|dparam|",
    "replicas",
)
_FILES = [
    ("compress.txt", "the table and the crossover"),
    ("compress.csv", "the table"),
    ("compress.json", "settings, definitions, links, every job"),
    ("trace.json", "Chrome trace of each hook's representative step"),
]


def _pays(c: Crossover) -> str:
    if not c.pays_at:
        return f"{c.hook} never pays"
    if c.lowest == c.highest:
        return f"{c.hook} pays at {c.lowest:g} Mbit/s"
    return f"{c.hook} pays at {c.lowest:g}..{c.highest:g} Mbit/s"


def page(summary: CompressSummary) -> Results:
    """The page and the run's summary.json fields."""
    result = summary.result
    rows = [
        [
            r.rate_mbit,
            r.hook,
            r.median_step_ms,
            "/".join(f"{m:.0f}" for m in r.round_step_ms),
            r.speedup_vs_none,
            r.wire_mb,
            r.job_sent_mb,
            r.final_loss,
            r.loss_vs_exact,
            r.loss_vs_none,
            r.max_param_diff,
            "identical" if r.parity else "DIVERGED",
        ]
        for r in summary.rows
    ]
    links = [
        [lk.rate_mbit, lk.shaper, lk.measured_mbit, lk.rtt_p50_ms, lk.baseline_rtt_p50_ms, lk.line]
        for lk in result.links
    ]
    plan = result.plan
    sections = [
        Section(
            "Per rate and hook",
            [
                Table(
                    _HEADERS,
                    rows,
                    f"{plan.nodes} ranks, model {plan.train.model}; medians over the rounds",
                )
            ],
        ),
        Section("Crossover", [Text([crossover_line(c) for c in summary.crossovers])]),
        figures_section(result.run_dir, [("compress.png", "step time and price per rate")]),
        Section(
            "Links, as the probe measured them",
            [
                Table(
                    (
                        "rate Mbit/s",
                        "shaper",
                        "measured Mbit/s",
                        "rtt p50 ms",
                        "unshaped p50 ms",
                        "probe",
                    ),
                    links,
                )
            ],
        ),
    ]
    figure = "; ".join(_pays(c) for c in summary.crossovers if c.hook != "none")
    headline = (summary.broken, "replicas identical in every job", figure)
    configs = {f"{r.rate_mbit:g} Mbit/s, {r.hook}": r.median_step_ms for r in summary.rows}
    ranks = {r.job: r.codes for r in result.runs}
    return sweep_results("compress", result, sections, ranks, headline, configs, _FILES)
