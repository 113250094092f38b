"""``lab latency``'s run: one cluster for the whole sweep; per delay a shaped, verified link;
per configuration a training job followed through its records.

The nodes idle (a bounded ``sleep``) between jobs. Every configuration is a
``cluster.train(job, cfg, run_timeout)`` job with its own rendezvous and log directory
(``runs/<run-id>/<job>/``), followed with ``job.wait``: progress from rank 0's step records,
success from the exits and end records, never from text. On the way out, also on errors and
Ctrl-C, the cluster collects every job's logs and removes everything of the run.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ddp.torchfree import RankLog
from lab.engine.client import connect
from lab.engine.cluster import Cluster
from lab.experiments.followed import train_to_end
from lab.experiments.latency.console import describe
from lab.experiments.latency.link import link
from lab.experiments.latency.plan import LatencyPlan, Planned
from lab.experiments.latency.result import ConfigRun, SweepResult
from lab.experiments.latency.stats import summarize
from lab.words import count

__all__ = ["run_sweep"]


def _run_config(cluster: Cluster, plan: LatencyPlan, p: Planned, echo: Callable) -> ConfigRun:
    started = time.monotonic()
    job = train_to_end(
        cluster, p.job, p.train, plan.run_timeout_s, progress=plan.progress, echo=echo,
        where=f"{p.conf.label} at {p.ms:g} ms (round {p.round})",
        slow_hint="a low --rate-mbit makes steps slow", broken_parity_ok=True,
    )  # fmt: skip
    logs = {rank: RankLog(rank, records) for rank, records in job.records.items()}
    stats = summarize([(f"job {p.job}", logs)], plan.warmup)
    parity = None
    if not p.conf.is_floor:
        parity = job.verdict is not None and job.verdict.holds
        parity = parity and all(code == 0 for code in job.codes.values())
    return ConfigRun(p.conf, p.ms, p.round, p.job, job.codes, stats, parity,
                     time.monotonic() - started)  # fmt: skip


def run_sweep(plan: LatencyPlan, echo: Callable[[str], None] = print) -> SweepResult:
    """Start the nodes, shape and verify each delay, run every configuration; the cluster
    collects the logs into ``runs_dir/<run-id>/<job>/`` and removes everything, always."""
    # Bounds everything the run leaves running in the nodes, should lab itself die.
    lifetime_s = plan.total * (plan.run_timeout_s + 60) + 600
    cpus = {n: plan.cpus for n in range(plan.nodes)} if plan.cpus else None
    cluster = Cluster(connect(), plan.layout, image=plan.image, lifetime_s=lifetime_s,
                      net_admin=True, cpus=cpus, echo=echo)  # fmt: skip
    result = SweepResult(plan, cluster.run_id, plan.runs_dir / cluster.run_id)
    cluster.run_dir = result.run_dir
    echo(
        f"run {cluster.run_id}: {count(plan.nodes, 'node')}, model {plan.train.model}, "
        f"{count(len(plan.configurations()), 'configuration')} x {count(plan.rounds, 'round')} x "
        f"{count(plan.train.steps, 'step')} at {', '.join(f'{m:g}' for m in plan.ms)} ms; "
        f"output in {result.run_dir}/"
    )
    started = time.monotonic()
    try:
        with cluster:
            for ms in plan.ms:
                with link(cluster, plan, ms, lifetime_s) as shaped:
                    if shaped.note:
                        echo(shaped.note)
                    echo(shaped.line)
                    result.links.append(shaped)
                    for p in plan.jobs(ms):
                        result.runs.append(_run_config(cluster, plan, p, echo))
                        echo(describe(result.runs[-1], len(result.runs), plan.total))
    finally:
        result.seconds = time.monotonic() - started
    return result
