"""``lab kill --launcher torchrun``: one worker process SIGKILLed (or, ``--mode host``, a
host's nodes taken away), torchrun's agent restarts the worker group, the workers resume from
the newest checkpoint by themselves; compared with an uninterrupted run of the same job.

plan (:mod:`.plan`) -> run (:mod:`.run`) -> analysis (:mod:`.analysis`: one
:class:`~.analysis.TorchrunSummary`, the restart timeline from :mod:`.restarts`) ->
``report.json`` (:mod:`.outputs`), the console text (the verdict's lines) and the page
(:mod:`.page`), each from that summary."""

from __future__ import annotations

from lab.experiments.kill.torchrun.analysis import analyse
from lab.experiments.kill.torchrun.outputs import write_files
from lab.experiments.kill.torchrun.page import page
from lab.experiments.kill.torchrun.plan import TorchrunKillPlan
from lab.experiments.kill.torchrun.result import TorchrunKillResult
from lab.experiments.kill.torchrun.run import run
from lab.report.publish import publish

__all__ = ["TorchrunKillPlan", "TorchrunKillResult", "report", "run"]


def report(result: TorchrunKillResult) -> int:
    """Exit 0 when the workers were restarted, resumed from a checkpoint and ended bitwise
    identical to the uninterrupted run."""
    summary = analyse(result)
    write_files(summary)
    made = page(summary)
    for line in publish(result.run_dir, made.page, made.summary, made.files, made.jobs):
        print(line)
    print("\n".join(summary.verdict.lines()))
    return 0 if summary.verdict.ok else 1
