"""``lab run``'s page: the headline, the step times and the link's bytes over time (the faults
marked), the fault timeline, each node's exit and the diagnosis. From the run's summary."""

from __future__ import annotations

from ddp.torchfree import Headline, Page, Section, Table, Text
from lab.experiments.run.analysis import RunSummary
from lab.experiments.run.outputs import FIGURE
from lab.report.common import command_line, figures_section
from lab.report.results import Results
from lab.report.summary import RunSummary as Summary
from lab.report.summary import started_at

__all__ = ["page"]

_FILES = [("report.json", "the plan, every step record, the faults, the exits, the diagnosis")]


def page(summary: RunSummary) -> Results:
    result = summary.result
    command = command_line("run")
    verdict = summary.broken or summary.replicas()
    figure = summary.headline()
    caption = "step time per rank; MB on the link per step"
    sections = [figures_section(result.run_dir, [(FIGURE, caption)])]
    if result.diagnosis is not None:
        sections.append(Section("Diagnosis", [Text([result.diagnosis], pre=True)]))
    timeline = [f"{f.at_s:+8.2f} s  {f.text}" for f in result.faults] or ["no fault"]
    sections.append(Section("Faults (seconds from the job's start)", [Text(timeline, pre=True)]))
    if result.links:
        sections.append(Section("The link, verified by the probe", [Text(result.links, pre=True)]))
    last = {r: max(s.step for s in steps) for r, steps in summary.per_rank.items()}
    rows = [
        [r, last.get(r, "-"), result.digests.get(r, "-")[:16]]
        for r in range(result.plan.layout.world_size)
    ]
    exits = [[f"node{n}", c] for n, c in sorted(result.exits.items())]
    exits += [[f"node{n}", "still running, stopped"] for n in result.running]
    sections.append(
        Section(
            "How each rank and node ended",
            [
                Table(("rank", "last step", "parameter digest"), rows),
                Table(("node", "torchrun's exit code"), exits),
            ],
        )
    )
    ok = summary.ok and summary.identical is not False
    html = Page(f"lab run: run {result.run_id}", Headline(command, verdict, figure, ok), sections)
    configs = {"run": summary.median_ms} if summary.median_ms is not None else {}
    made = Summary(
        "run", result.run_id, command, started_at(result.seconds), result.seconds, figure,
        verdict, ok, configs,
    )  # fmt: skip
    return Results(html, made, list(_FILES), ["job"])
