"""A run that raises (the engine failed, a phase timed out, Ctrl-C) never reaches its
experiment's report; :func:`guarded` writes the failure page for it on the way out, then lets
the error go on to the command line as before."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from lab.report.failed import failure_report
from lab.report.publish import publish

__all__ = ["guarded", "report_failure"]

R = TypeVar("R")


def report_failure(name: str, run_dir: Path, error: str, seconds: float = 0.0) -> None:
    """Write the failure page of the run in ``run_dir`` and print where it is."""
    page, summary, jobs = failure_report(name, run_dir.name, run_dir, error, seconds)
    for line in publish(run_dir, page, summary, jobs=jobs):
        print(line, file=sys.stderr)


def _why(e: BaseException) -> str:
    if isinstance(e, KeyboardInterrupt):
        return "interrupted (Ctrl-C)"
    return f"{e}" if type(e).__name__ == "LabError" else f"{type(e).__name__}: {e}"


def guarded(name: str, run: Callable[[Any], R]) -> Callable[[Any], R]:
    """``run`` that, when it raises after a cluster started, first writes that run's page."""
    from lab.engine import cluster

    def guarded_run(plan: Any) -> R:
        before, t0 = len(cluster.STARTED), time.monotonic()
        try:
            return run(plan)
        except (Exception, KeyboardInterrupt) as e:
            for run_id in cluster.STARTED[before:]:
                run_dir = Path(plan.runs_dir) / run_id
                try:
                    report_failure(name, run_dir, _why(e), time.monotonic() - t0)
                except Exception as inner:  # the original error matters more
                    print(f"warning: no report for {run_dir}: {inner}", file=sys.stderr)
            raise

    return guarded_run
