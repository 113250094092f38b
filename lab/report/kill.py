"""``lab kill``'s page: the diagnosis as the headline (``rank 2 missing at step 5``), the
fault phase's timeline, the per-rank table (what each survivor was stuck in, when it noticed,
what it saw), the recovery check, and every phase's ranks. From the run's result and its
fault report; ``--launcher torchrun`` runs from their verdict (timeline, checks)."""

from __future__ import annotations

from typing import Any

from ddp.torchfree import Headline, Page, Section, Table, Text
from lab.report.common import command_line, ranks_section
from lab.report.failed import key_figure
from lab.report.results import Results
from lab.report.summary import RunSummary, started_at

__all__ = ["kill_results", "torchrun_kill_results"]

_HEADINGS = (
    "rank",
    "node",
    "role",
    "stuck in (collective, step, seq)",
    "waited in it",
    "noticed after fault",
    "what it saw",
    "exit code",
)
_FILES = [
    ("report.json", "the plan, the injection, every phase's exits, the checks"),
    ("fault/logs/flight/", "the fault phase's flight recorder dumps"),
]


def _finish(
    result: Any, sections: list, verdict: str, figure: str, ok: bool, files: int = 2
) -> Results:
    """The page and summary around the experiment's ``sections``; the first ``files`` of the
    run's files linked."""
    command = command_line("kill")
    problems: list[str] = []
    phases = {name: dict(codes) for name, codes in _phase_codes(result).items()}
    sections = [*sections, ranks_section(result.run_dir, phases, problems)]
    page = Page(
        f"lab kill: run {result.run_id}",
        Headline(command, verdict, figure, ok),
        sections,
        problems=problems,
    )
    summary = RunSummary(
        "kill",
        result.run_id,
        command,
        started_at(result.seconds),
        result.seconds,
        figure,
        verdict,
        ok,
    )
    return Results(page, summary, _FILES[:files], list(phases))


def _phase_codes(result: Any) -> dict[str, dict[int, int]]:
    if hasattr(result, "phases"):
        return {name: ph.codes for name, ph in result.phases.items()}
    return {job.name: job.codes for job in (result.reference, result.fault)}


def kill_results(result: Any, summary: Any) -> Results:
    """``summary``: the run's :class:`lab.experiments.kill.summary.Summary`."""
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
                Table(_HEADINGS, [r.cells() for r in report.rows]),
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
    return _finish(result, sections, verdict, figure, summary.ok)


def torchrun_kill_results(result: Any, verdict: Any) -> Results:
    """``verdict``: the run's :class:`lab.experiments.kill.torchrun_analysis.Verdict`."""
    at = "" if verdict.fault_at_s is None else f"; the fault came {verdict.fault_at_s:.2f} s in"
    checks = Table(("check", "what"), [["ok" if c.ok else "FAIL", c.text] for c in verdict.checks])
    shas = Table(
        ("rank", "uninterrupted sha256", "restarted sha256", "equal"),
        [
            [r, a or "-", b or "-", a is not None and a == b]
            for r, (a, b) in sorted(verdict.shas.items())
        ],
    )
    sections = [
        Section(
            f"Restart timeline (seconds from the fault{at})", [Text(verdict.timeline, pre=True)]
        ),
        Section("Checks", [checks]),
        Section("Final parameters", [shas]),
    ]
    restarted = ", ".join(f"rank {r} after step {s}" for r, s in sorted(verdict.restarted.items()))
    figure = f"restarted: {restarted}" if restarted else "no worker restarted"
    return _finish(result, sections, verdict.recovered.line, figure, verdict.ok, files=1)
