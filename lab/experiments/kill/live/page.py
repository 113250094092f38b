"""``lab kill --recovery live``'s page: the headline line, the timeline and the verdict, the
table of recovery paths on the same job. From the run's summary."""

from __future__ import annotations

from ddp.torchfree import Headline, Page, Section, Text
from lab.experiments.kill.live.analysis import LiveSummary
from lab.experiments.kill.live.outputs import FILE
from lab.experiments.kill.live.text import headline, lines, table
from lab.report.common import command_line
from lab.report.results import Results
from lab.report.summary import RunSummary, started_at

__all__ = ["page"]


def page(summary: LiveSummary) -> Results:
    result, live = summary.result, summary.live
    last = headline(summary)
    command = command_line("kill")
    figure = "-" if live.fault_to_commit_s is None else f"{live.fault_to_commit_s:.2f} s to commit"
    made = Page(
        f"lab kill --recovery {result.plan.recovery}: run {result.run_id}",
        Headline(command, last, figure, summary.ok),
        [
            Section("Timeline and verdict", [Text(lines(summary)[:-1])]),
            Section("Recovery paths on the same job", [Text(table(summary.rows))]),
        ],
    )
    run_summary = RunSummary(
        "kill",
        result.run_id,
        command,
        started_at(result.seconds),
        result.seconds,
        figure,
        last,
        summary.ok,
    )
    jobs = [name for name in ("live", "rejoin") if name in result.logs]
    return Results(made, run_summary, [(FILE, "the figures")], jobs)
