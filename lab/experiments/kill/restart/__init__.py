"""``lab kill`` on the restart path: the survivors of a fault exit with ddp's diagnosis; with
``--recover`` an uninterrupted run comes first and every rank then resumes from the fault
phase's newest checkpoint, compared bit for bit with it.

plan (:mod:`.plan`) -> run (:mod:`.run`) -> analysis (:mod:`.analysis`: one
:class:`~.analysis.RestartSummary`) -> ``report.json`` (:mod:`.outputs`), the console text
(:mod:`.text`) and the page (:mod:`.page`), each from that summary."""

from __future__ import annotations

from lab.experiments.kill.restart.analysis import analyse
from lab.experiments.kill.restart.outputs import write_files
from lab.experiments.kill.restart.page import page
from lab.experiments.kill.restart.plan import KillPlan
from lab.experiments.kill.restart.result import KillResult
from lab.experiments.kill.restart.run import run
from lab.experiments.kill.restart.text import lines
from lab.report.publish import publish

__all__ = ["KillPlan", "KillResult", "report", "run"]


def report(result: KillResult) -> int:
    """Exit 0 when the diagnosis names the rank that was hit (and, with --recover, the
    resumed run ended bitwise identical to the uninterrupted one)."""
    summary = analyse(result)
    write_files(summary)
    made = page(summary)
    for line in publish(result.run_dir, made.page, made.summary, made.files, made.jobs):
        print(line)
    print("\n".join(lines(summary)))
    return 0 if summary.ok else 1
