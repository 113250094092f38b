"""``lab latency``'s run (:func:`lab.experiments.sweep.run_sweep`): per delay a shaped,
verified link; per configuration and round a training job followed through its records, its
statistics taken from the records the ranks streamed."""

from __future__ import annotations

import time
from collections.abc import Callable

from ddp.torchfree import RankLog
from lab.engine.cluster import Cluster
from lab.experiments.followed import holds, train_to_end
from lab.experiments.latency.analysis import summarize
from lab.experiments.latency.link import link
from lab.experiments.latency.plan import LatencyPlan, Planned
from lab.experiments.latency.result import ConfigRun, SweepResult
from lab.experiments.latency.text import describe
from lab.experiments.sweep import run_sweep
from lab.words import count

__all__ = ["run"]


def _in(p: Planned) -> str:
    return f", {p.phase.title} phase" if p.phase and p.phase.key else ""


def _run_config(cluster: Cluster, plan: LatencyPlan, p: Planned, echo: Callable) -> ConfigRun:
    started = time.monotonic()
    where = f"{p.conf.label} at {p.ms:g} ms{_in(p)} (round {p.round})"
    slow = "a low --rate-mbit makes steps slow"
    job = train_to_end(
        cluster, p.job, p.train, plan, where=where, slow_hint=slow, echo=echo, broken_parity_ok=True
    )
    logs = {rank: RankLog(rank, records) for rank, records in job.records.items()}
    stats = summarize([(f"job {p.job}", logs)], plan.warmup)
    parity = None
    if not p.conf.is_floor:
        parity = holds(job) and all(code == 0 for code in job.codes.values())
    return ConfigRun(
        p.conf, p.ms, p.round, p.job, job.codes, stats, parity, time.monotonic() - started, p.phase
    )


def _header(result: SweepResult) -> str:
    plan: LatencyPlan = result.plan
    at = f"at {', '.join(f'{m:g}' for m in plan.ms)} ms"
    if plan.phased:
        phases = plan.phases()[:2]
        what = ", ".join(f"{p.title} {len(p.configurations)}" for p in phases)
        confs = f"2 phases ({what} configurations)"
    else:
        confs = f"model {plan.train.model}, {count(len(plan.configurations()), 'configuration')}"
    return (
        f"run {result.run_id}: {count(plan.nodes, 'node')}, {confs} x "
        f"{count(plan.rounds, 'round')} x {count(plan.train.steps, 'step')} {at}; "
        f"output in {result.run_dir}/"
    )


def run(plan: LatencyPlan, echo: Callable[[str], None] = print) -> SweepResult:
    """Start the nodes, shape and verify each phase's link, run its configurations; the cluster
    collects the logs into ``runs_dir/<run-id>/<job>/`` and removes everything, always."""
    cpus = {n: plan.cpus for n in range(plan.nodes)} if plan.cpus else None
    return run_sweep(
        plan,
        plan.phases(),
        new_result=SweepResult,
        header=_header,
        link=link,
        run_job=_run_config,
        describe=describe,
        echo=echo,
        cpus=cpus,
    )
