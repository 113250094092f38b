"""``lab topology``'s run: per layout one cluster (:func:`lab.experiments.sweep.sweep_cluster`,
the run's one id and folder shared by them all, one after the other), its link held by a
:class:`lab.shaping.changing.ChangingLink`: cleared for the limit, shaped and verified for the
others; per job a training job followed through its records, success from the exits and ddp's
verdict, every node's eth0 counters sampled while it ran (:mod:`.counters`); with a change, the
link re-shaped at the step (:mod:`lab.experiments.changed_job`) and verified again once idle."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from lab.engine.cluster import Cluster
from lab.experiments.changed_job import ChangeTrigger, recheck
from lab.experiments.followed import holds, train_to_end
from lab.experiments.sweep import lifetime, sweep_cluster
from lab.experiments.topology.plan import Planned, TopologyPlan
from lab.experiments.topology.result import ConfigRun, LinkInfo, TopologyResult
from lab.measure.counters import sampled
from lab.shaping.changing import ChangingLink

__all__ = ["run"]

_SAMPLER_SLACK_S = 120.0  # the sampler outlives the job's timeout by this, then ends itself
Echo = Callable[[str], None]


def _say_retries(link: ChangingLink, echo: Echo) -> None:
    """A strict check that passed only on its second attempt says what the first measured."""
    for first in link.retried:
        echo(f"link check passed on a second attempt; the first: {first}")
    link.retried.clear()


def _shape_for(
    link: ChangingLink, plan: TopologyPlan, p: Planned, result: TopologyResult, echo: Echo
) -> None:
    """The link ``p`` runs on: bare for the limit, else the plan's, verified when it changes."""
    if p.conf.unshaped:
        if link.setting != (0.0, None):
            link.clear()
            echo("link cleared: the limit runs on the bare link")
        return
    report = link.ensure(plan.ms, plan.rate_mbit)
    _say_retries(link, echo)
    if report is not None:
        if report.note:
            echo(report.note)
        echo(report.line())
        result.links.append(LinkInfo.from_report(report, p.layout.name))


def _run_job(
    cluster: Cluster,
    plan: TopologyPlan,
    p: Planned,
    link: ChangingLink,
    result: TopologyResult,
    echo: Echo,
) -> ConfigRun:
    started = time.monotonic()
    where = f"{p.conf.label} on {p.layout.name} (round {p.round})"
    slow = "a long --ms or a low --rate-mbit makes steps slow"
    trigger = None
    if plan.change is not None and not p.conf.unshaped:
        trigger = ChangeTrigger(link, plan.change, echo)
    with sampled(cluster, f"eth0-{p.job}", plan.run_timeout_s + _SAMPLER_SLACK_S) as counters:
        job = train_to_end(
            cluster,
            p.job,
            p.train,
            plan,
            where=where,
            slow_hint=slow,
            echo=echo,
            broken_parity_ok=True,
            on_event=trigger,
        )
    if trigger is not None and trigger.fired:
        report = recheck(link, plan.change)
        _say_retries(link, echo)
        if report is not None:
            what = f"after the change, idle (after {p.job})"
            result.links.append(LinkInfo.from_report(report, p.layout.name, what))
            echo(f"  the changed link, idle after the job: {report.line()}")
    parity = holds(job) and all(code == 0 for code in job.codes.values())
    return ConfigRun(
        p.conf.name,
        p.round,
        p.job,
        dict(job.codes),
        parity,
        time.monotonic() - started,
        counters,
        p.layout.name,
        trigger.change if trigger is not None and trigger.fired else None,
    )


def _describe(run: ConfigRun, done: int, total: int) -> str:
    return (
        f"[{done:>2}/{total}] {run.layout} round {run.round}  {run.conf:<18} parity "
        f"{'holds' if run.parity else 'BROKEN'}  ({run.seconds:.0f} s)"
    )


def run(plan: TopologyPlan, echo: Echo = print) -> TopologyResult:
    """Per layout: start the nodes, run every job on its link; each cluster collects its logs
    into ``runs_dir/<run-id>/<job>/`` and removes everything, always."""
    result: TopologyResult | None = None
    started = time.monotonic()

    def new_result(_plan: object, run_id: str, run_dir: object) -> TopologyResult:
        nonlocal result
        if result is None:
            result = TopologyResult(plan, run_id, run_dir, cpus=os.cpu_count())
        return result

    def header(r: TopologyResult) -> str:
        if len(r.runs) == 0:
            return f"run {r.run_id}: {plan.describe()}; output in {r.run_dir}/"
        return f"layout {sub.layouts[0].describe()}: a cluster of its own"

    total = plan.total
    for sub in plan.per_layout():
        life = lifetime(len(sub.jobs()), plan.run_timeout_s)
        run_id = result.run_id if result is not None else None
        cluster_run = sweep_cluster(sub, new_result, header, echo, lifetime_s=life, run_id=run_id)
        with cluster_run as (cluster, res), ChangingLink(cluster, plan.shaper, life) as link:
            for p in sub.jobs():
                _shape_for(link, plan, p, res, echo)
                res.runs.append(_run_job(cluster, sub, p, link, res, echo))
                echo(_describe(res.runs[-1], len(res.runs), total))
    assert result is not None
    result.seconds = time.monotonic() - started
    return result
