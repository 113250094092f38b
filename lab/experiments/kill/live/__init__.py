"""``python -m lab kill --recovery live``: the survivors of a lost rank go on in a new quorum
within seconds, a replacement heals from a peer (``--rejoin``), nothing restarts and nothing
is read from disk; measured beside the restart path on the same job.

ddp does the recovery (:mod:`ddp.recovery`); the lab runs its coordinator in a container of
its own, injects the fault, starts the replacement, and reads the ranks' typed records.

plan (:mod:`.plan`) -> run (:mod:`.run`) -> analysis (:mod:`.analysis`: one
:class:`~.analysis.LiveSummary`) -> ``live.json`` (:mod:`.outputs`), the console text
(:mod:`.text`) and the page (:mod:`.page`), each from that summary."""

from __future__ import annotations

from lab.experiments.kill.live.analysis import analyse
from lab.experiments.kill.live.outputs import write_files
from lab.experiments.kill.live.page import page
from lab.experiments.kill.live.plan import LivePlan
from lab.experiments.kill.live.result import LiveResult
from lab.experiments.kill.live.run import run
from lab.experiments.kill.live.text import lines
from lab.report.publish import publish

__all__ = ["LivePlan", "LiveResult", "report", "run"]


def report(result: LiveResult) -> int:
    """Print the timeline, the paths and the verdict; write live.json, the page and the
    summary. Exit 0 only if the verdict holds (:func:`.analysis.judge`)."""
    summary = analyse(result)
    write_files(summary)
    made = page(summary)
    text = lines(summary)
    published = publish(result.run_dir, made.page, made.summary, made.files, made.jobs)
    print("\n".join([*text[:-1], *published, text[-1]]))
    return 0 if summary.ok else 1
