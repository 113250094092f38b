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
from pathlib import Path

from ddp.records import EndRecord, RankLog
from lab.engine.client import NodeFailed, RunTimeout, connect
from lab.engine.cluster import Cluster
from lab.engine.job import Job
from lab.experiments.latency.console import describe
from lab.experiments.latency.link import link
from lab.experiments.latency.plan import LatencyPlan, Planned
from lab.experiments.latency.result import ConfigRun, SweepResult
from lab.experiments.latency.stats import summarize
from lab.progress import Progress, follow_steps
from lab.words import count

__all__ = ["run_sweep"]

_FAIL_GRACE_S = 10.0  # after a rank fails, how long the others get to say what they saw
_WAIT_SLACK_S = 30.0  # the launcher ends ranks at --run-timeout; the host waits this much more


def _ended(job: Job, rank: int) -> bool:
    return any(isinstance(r, EndRecord) for r in job.records.get(rank, []))


def _check_finished(
    job: Job, running: list[int], p: Planned, timeout_s: float, run_dir: Path
) -> None:
    """Every rank exited 0, or 1 with an end record (it finished, parity broken: by design for
    the floor). Anything else is a crash, a timeout, or an image without this ddp."""
    where = f"{p.conf.label} at {p.ms:g} ms (round {p.round})"
    output = run_dir / p.job  # where the cluster collects the job's output on the way out
    if running:
        tails = "\n".join(f"  rank {r}:\n{job.last_lines(r, 3)}" for r in running)
        raise RunTimeout(
            f"{where}: ranks {running} still running after {timeout_s:g} s; last lines:\n"
            f"{tails}\nraise --run-timeout, or look for a stuck rank (all output in {output}/)"
        )
    for rank, code in job.codes.items():
        if code not in (0, 1) or not _ended(job, rank):
            hint = " (stopped by --run-timeout)" if code in (124, 137) else ""
            raise NodeFailed(
                f"{where}: rank {rank} exited with code {code}{hint} before finishing; its last "
                f"lines:\n{job.last_lines(rank, 15)}\n(all output in {output}/; "
                "if the image is stale, `python -m lab image`)"
            )


def _run_config(
    cluster: Cluster, plan: LatencyPlan, p: Planned, run_dir: Path, echo: Callable
) -> ConfigRun:
    started = time.monotonic()
    progress = Progress(p.train.steps, enabled=plan.progress, echo=echo)
    try:
        job = cluster.train(p.job, p.train, plan.run_timeout_s, echo=follow_steps(progress))
        running = job.wait(plan.run_timeout_s + _WAIT_SLACK_S, fail_grace_s=_FAIL_GRACE_S)
    finally:
        progress.close()
    _check_finished(job, running, p, plan.run_timeout_s, run_dir)
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
                        result.runs.append(_run_config(cluster, plan, p, result.run_dir, echo))
                        echo(describe(result.runs[-1], len(result.runs), plan.total))
    finally:
        result.seconds = time.monotonic() - started
    return result
