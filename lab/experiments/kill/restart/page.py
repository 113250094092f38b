"""``lab kill``'s page (the restart path): the diagnosis as the headline (``rank 2 missing at
step 5``), the fault phase's timeline, the per-rank table (what each survivor was stuck in,
when it noticed, what it saw), the recovery check, and every phase's ranks. From the run's
summary."""

from __future__ import annotations

from ddp.torchfree import Section, Table, Text
from lab.experiments.kill.page import kill_page
from lab.experiments.kill.restart.analysis import HEADINGS, RestartSummary
from lab.report.failed import key_figure
from lab.report.results import Results

__all__ = ["page"]

_FILES = [
    ("report.json", "the plan, the injection, every phase's exits, the checks"),
    ("fault/logs/flight/", "the fault phase's flight recorder dumps"),
]


def page(summary: RestartSummary) -> Results:
    report, recovery = summary.report, summary.recovery
    timeline = Table(
        ("s since the fault phase started", "event"),
        [[f"{t:+.2f}", what] for t, what in report.timeline],
    )
    sections = [
        Section("Timeline of the fault phase", [timeline]),
        Section(
            "Ranks in the fault phase",
            [
                Table(HEADINGS, [r.cells() for r in report.rows]),
                Text([f"note: {n}" for n in report.notes]),
            ],
        ),
    ]
    verdict = report.last_line
    if recovery is not None:
        sections.append(Section("Recovery", [Text([*recovery.details, recovery.last_line])]))
        verdict += f"; {recovery.last_line}"
    diag = report.diagnosis
    figure = key_figure(diag.summary()) if diag.stuck_seq is not None else "no diagnosis"
    result = summary.result
    phases = {name: ph.codes for name, ph in result.phases.items()}
    run = (result.run_id, result.run_dir, result.seconds)
    return kill_page(run, sections, phases, (verdict, figure, summary.ok), _FILES)
