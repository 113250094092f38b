"""The run every sweep experiment (``latency``, ``compress``, ``straggler``) shares: one cluster
for the whole run; per setting (a delay, a rate) the nodes' links shaped and verified, then that
setting's jobs, each followed to its end (:mod:`lab.experiments.followed`).

An experiment supplies its plan (the settings, each setting's jobs, the run's bounds), its link
(a context manager that shapes, verifies and undoes), how one job runs and the line it prints
when done. The nodes idle between jobs; on the way out, also on errors and Ctrl-C, the cluster
collects every job's logs into ``runs/<run-id>/<job>/`` and removes everything of the run. The
report's side is :mod:`lab.report.report`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

from lab.engine.client import connect
from lab.engine.cluster import Cluster
from lab.report.report import SweepResult

__all__ = ["Shaped", "lifetime", "run_sweep", "sweep_cluster"]

R = TypeVar("R", bound=SweepResult)
S = TypeVar("S")
Echo = Callable[[str], None]


class Shaped(Protocol):
    """What a setting's link reports: the probe's line, and a note (e.g. the shaper chosen)."""

    note: str
    line: str


def lifetime(jobs: int, run_timeout_s: float) -> float:
    """Bounds everything a run of ``jobs`` jobs leaves running in the nodes, should lab die."""
    return jobs * (run_timeout_s + 60) + 600


@contextlib.contextmanager
def sweep_cluster(
    plan: Any,
    new_result: Callable[[Any, str, Any], R],
    header: Callable[[R], str],
    echo: Echo,
    *,
    lifetime_s: float,
    net_admin: bool = True,
    cpus: Mapping[int, float] | None = None,
    run_id: str | None = None,
) -> Iterator[tuple[Cluster, R]]:
    """The run's cluster, started, and its result (``new_result(plan, run_id, run_dir)``),
    whose ``seconds`` it sets on the way out; ``header`` is the run's first line. ``run_id``:
    an earlier cluster's, whose run this one continues (one after the other, never at once)."""
    cluster = Cluster(
        connect(),
        plan.layout,
        run_id=run_id,
        image=plan.image,
        lifetime_s=lifetime_s,
        net_admin=net_admin,
        cpus=cpus,
        echo=echo,
    )
    result = new_result(plan, cluster.run_id, plan.runs_dir / cluster.run_id)
    cluster.run_dir = result.run_dir
    echo(header(result))
    started = time.monotonic()
    try:
        with cluster:
            yield cluster, result
    finally:
        result.seconds = time.monotonic() - started


def run_sweep(
    plan: Any,
    settings: Iterable[S],
    *,
    new_result: Callable[[Any, str, Any], R],
    header: Callable[[R], str] | None = None,
    link: Callable[[Cluster, Any, S, float], AbstractContextManager[Shaped]],
    run_job: Callable[[Cluster, Any, Any, Echo], Any],
    describe: Callable[[Any, int, int], str],
    echo: Echo = print,
    cpus: Mapping[int, float] | None = None,
) -> R:
    """Per setting, in order: ``link(cluster, plan, setting, lifetime_s)`` shaped and verified,
    then every job of ``plan.jobs(setting)`` run with ``run_job(cluster, plan, job, echo)``
    while the link holds, each followed by its ``describe(run, done, total)`` line. The run's
    first line is ``header(result)``, by default its id, ``plan.describe()`` and its folder."""
    if header is None:

        def header(r: R) -> str:
            return f"run {r.run_id}: {plan.describe()}; output in {r.run_dir}/"

    lifetime_s = lifetime(plan.total, plan.run_timeout_s)
    with sweep_cluster(plan, new_result, header, echo, lifetime_s=lifetime_s, cpus=cpus) as (
        cluster,
        result,
    ):
        for setting in settings:
            with link(cluster, plan, setting, lifetime_s) as shaped:
                if shaped.note:
                    echo(shaped.note)
                echo(shaped.line)
                result.links.append(shaped)
                for planned in plan.jobs(setting):
                    result.runs.append(run_job(cluster, plan, planned, echo))
                    echo(describe(result.runs[-1], len(result.runs), plan.total))
    return result
