"""``lab kill --launcher torchrun``'s page: the restart timeline, the checks, the final
parameters of both runs side by side, and every job's ranks. From the run's summary."""

from __future__ import annotations

from ddp.torchfree import Section, Table, Text
from lab.experiments.kill.page import kill_page
from lab.experiments.kill.torchrun.analysis import TorchrunSummary
from lab.report.results import Results

__all__ = ["page"]

_FILES = [("report.json", "the plan, the kill, both jobs' exits, the checks")]


def page(summary: TorchrunSummary) -> Results:
    verdict = summary.verdict
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
    result = summary.result
    phases = {job.name: job.codes for job in (result.reference, result.fault)}
    run = (result.run_id, result.run_dir, result.seconds)
    return kill_page(run, sections, phases, (verdict.recovered.line, figure, verdict.ok), _FILES)
