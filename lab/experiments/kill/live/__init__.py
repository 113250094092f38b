"""``python -m lab kill --recovery live``: the survivors of a lost rank go on in a new quorum
within seconds, a replacement heals from a peer (``--rejoin``), nothing restarts and nothing
is read from disk; measured beside the restart path on the same job.

ddp does the recovery (:mod:`ddp.recovery`); the lab runs its coordinator in a container of
its own, injects the fault, starts the replacement, and reads the ranks' typed records."""

from __future__ import annotations

import dataclasses
import json

from ddp.torchfree import Headline, Page, Section, Text
from lab.experiments.kill.live.analysis import judge, live_row, restart_row
from lab.experiments.kill.live.plan import LivePlan
from lab.experiments.kill.live.result import LiveResult
from lab.experiments.kill.live.run import run
from lab.experiments.kill.live.text import lines, table
from lab.report.common import command_line
from lab.report.publish import publish
from lab.report.summary import RunSummary, started_at

__all__ = ["LivePlan", "LiveResult", "report", "run"]

_FILE = "live.json"


def report(result: LiveResult) -> int:
    """Print the timeline, the paths and the verdict; write live.json, the page and the
    summary. Exit 0 only if the verdict holds (:func:`.analysis.judge`)."""
    live, figs = live_row(result)
    restart = restart_row(result.restart)
    torchft = live_row(result.torchft)[0] if result.torchft is not None else None
    verdict = judge(result)
    if result.torchft is not None and not judge(result.torchft).ok:
        # its row is still shown; ours is judged on its own
        verdict.lines.append(
            "torchft's run on the same job FAILED: " + "; ".join(judge(result.torchft).lines)
        )
    text = lines(result, live, restart, figs, verdict, torchft)
    rows = [r for r in (restart, torchft, live) if r is not None]
    doc = {
        "run_id": result.run_id,
        "plan": {k: str(v) for k, v in dataclasses.asdict(result.plan).items()},
        "moments": [dataclasses.asdict(m) for m in result.moments],
        "figures": figs,
        "paths": [dataclasses.asdict(r) for r in rows],
        "exit_codes": result.codes,
        "restart_run": result.restart.run_id if result.restart else None,
        "torchft_run": result.torchft.run_id if result.torchft else None,
        "ok": verdict.ok,
        "verdict": verdict.lines,
        "headline": text[-1],
    }
    (result.run_dir / _FILE).write_text(json.dumps(doc, indent=2, default=str) + "\n")
    command = command_line("kill")
    figure = "-" if live.fault_to_commit_s is None else f"{live.fault_to_commit_s:.2f} s to commit"
    page = Page(
        f"lab kill --recovery {result.plan.recovery}: run {result.run_id}",
        Headline(command, text[-1], figure, verdict.ok),
        [
            Section("Timeline and verdict", [Text(text[:-1])]),
            Section("Recovery paths on the same job", [Text(table(rows))]),
        ],
    )
    summary = RunSummary(
        "kill",
        result.run_id,
        command,
        started_at(result.seconds),
        result.seconds,
        figure,
        text[-1],
        verdict.ok,
    )
    jobs = [name for name in ("live", "rejoin") if name in result.logs]
    published = publish(result.run_dir, page, summary, [(_FILE, "the figures")], jobs)
    print("\n".join([*text[:-1], *published, text[-1]]))
    return 0 if verdict.ok else 1
