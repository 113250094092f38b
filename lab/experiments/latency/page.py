"""``lab latency``'s page: bucketing and overlap as the headline, the sweep's table, the
per-bucket timings of the Gantt chart's pair, the figures, the verified links and every rank's
exit. From the sweep's summary."""

from __future__ import annotations

from ddp.torchfree import Section, Table, Text
from lab.experiments.latency.analysis import Headline, LatencySummary
from lab.experiments.latency.bucket_stats import ConfigTiming
from lab.experiments.latency.result import LinkReport
from lab.experiments.latency.text import headline_line, overlap_by_cap_line
from lab.report.common import figures_section
from lab.report.results import Results, ratio_text, sweep_results

__all__ = ["page"]

_ROW_HEADERS = (
    "delay ms",
    "configuration",
    "allreduce/step",
    "median step ms",
    "exposed comm ms",
    "speedup vs per-param",
    "parity",
    "steps measured",
)
_FILES = [
    ("latency.csv", "the table, one row per delay and configuration"),
    ("latency.json", "settings, definitions, links, every run"),
    ("trace.json", "Chrome trace of every configuration's representative step"),
]


def _figure(headlines: list[Headline]) -> str:
    several = len(headlines) > 1
    return "; ".join(
        f"bucketing {ratio_text(h.bucketing_speedup)}, overlap {ratio_text(h.overlap_gain)}"
        + (f" at {h.ms:g} ms" if several else "")
        for h in headlines
    )


def _timings(timings: list[ConfigTiming]) -> list[Table]:
    tables = []
    for t in timings:
        rows = [
            [b.bucket, b.compute_ms, b.launch_ms, b.comm_ms, b.after_backward_ms] for b in t.buckets
        ]
        caption = (
            f"{t.config}: forward {t.forward_ms:.1f} ms, backward {t.backward_ms:.1f} ms,"
            f" step {t.step_ms:.1f} ms (medians over {t.samples} rank-steps)"
        )
        tables.append(
            Table(
                ("bucket", "compute ms", "launch ms", "allreduce ms", "after backward ms"),
                rows,
                caption,
            )
        )
    return tables


def _links(links: list[LinkReport]) -> Table:
    rows = [
        [lk.ms, lk.shaper, lk.rtt_p50_ms, lk.rtt_p90_ms, lk.baseline_p50_ms, lk.line]
        for lk in links
    ]
    return Table(
        ("delay ms", "shaper", "rtt p50 ms", "rtt p90 ms", "unshaped p50 ms", "probe"), rows
    )


def page(summary: LatencySummary) -> Results:
    """The page and the run's summary.json fields."""
    result = summary.result
    rows = [
        [
            r.ms,
            r.config,
            r.calls,
            r.median_step_ms,
            r.exposed_comm_ms,
            r.speedup_vs_per_parameter,
            r.parity_text,
            r.steps_measured,
        ]
        for r in summary.rows
    ]
    lines = [overlap_by_cap_line(summary.rows, h.ms) for h in summary.headlines]
    lines += [headline_line(h) for h in summary.headlines]
    sections = [
        Section("Step time per configuration", [Table(_ROW_HEADERS, rows), Text(lines)]),
        Section("Per bucket (the Gantt chart's pair, round 1)", _timings(summary.gantt.timings)),
        figures_section(
            result.run_dir,
            [
                ("latency.png", "median step time vs bucket cap"),
                ("gantt.png", "one step, overlap on vs off"),
            ],
        ),
        Section("Links, as the probe measured them", [_links(result.links)]),
    ]
    held = "parity holds in every allreduce configuration"
    headline = (summary.broken, held, _figure(summary.headlines))
    # a two-phase run has a floor in each phase: the phase keeps the keys apart
    configs = {
        ", ".join(filter(None, (f"{r.ms:g} ms", r.phase, r.config))): r.median_step_ms
        for r in summary.rows
    }
    ranks = {run.job: run.codes for run in result.runs}
    return sweep_results("latency", result, sections, ranks, headline, configs, _FILES)
