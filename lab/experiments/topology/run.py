"""``lab topology``'s run (:func:`lab.experiments.sweep.run_sweep` with one setting): the link
between the nodes shaped and verified once, then per round and configuration a training job
followed through its records, success from the exits and ddp's verdict, every node's eth0
counters sampled while it ran (:mod:`.counters`)."""

from __future__ import annotations

import time
from collections.abc import Callable

from lab.engine.cluster import Cluster
from lab.experiments.followed import holds, train_to_end
from lab.experiments.sweep import run_sweep
from lab.experiments.topology.counters import sampled
from lab.experiments.topology.link import between_nodes
from lab.experiments.topology.plan import Planned, TopologyPlan
from lab.experiments.topology.result import ConfigRun, TopologyResult

__all__ = ["run"]

_SAMPLER_SLACK_S = 120.0  # the sampler outlives the job's timeout by this, then ends itself


def _run_job(cluster: Cluster, plan: TopologyPlan, p: Planned, echo: Callable) -> ConfigRun:
    started = time.monotonic()
    where = f"{p.conf.label} (round {p.round})"
    slow = "a long --ms or a low --rate-mbit makes steps slow"
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
        )
    parity = holds(job) and all(code == 0 for code in job.codes.values())
    return ConfigRun(
        p.conf.name, p.round, p.job, dict(job.codes), parity, time.monotonic() - started, counters
    )


def _describe(run: ConfigRun, done: int, total: int) -> str:
    return (
        f"[{done:>2}/{total}] round {run.round}  {run.conf:<18} parity "
        f"{'holds' if run.parity else 'BROKEN'}  ({run.seconds:.0f} s)"
    )


def run(plan: TopologyPlan, echo: Callable[[str], None] = print) -> TopologyResult:
    """Start the nodes, shape and verify the link, run every configuration; the cluster
    collects the logs into ``runs_dir/<run-id>/<job>/`` and removes everything, always."""
    return run_sweep(
        plan,
        [plan.link_text],
        new_result=TopologyResult,
        link=between_nodes,
        run_job=_run_job,
        describe=_describe,
        echo=echo,
    )
