"""``lab up``'s run: one training job on a fresh cluster, followed through its records.

The cluster's context manager collects every node's output and the job's logs into
``runs/<run-id>/train/`` and removes every container, network and volume of the run, also on
errors and Ctrl-C. Parity is then re-judged from the collected logs, not taken from a line.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from ddp.torchfree import ConfigRecord, check_logs
from lab.engine.client import NodeFailed, RunTimeout, connect
from lab.engine.cluster import Cluster
from lab.engine.events import Event, LineEvent, RecordEvent
from lab.engine.job import Job
from lab.engine.specs import new_run_id
from lab.engine.stats import ResourceSampler
from lab.experiments.up.plan import UpPlan
from lab.experiments.up.result import JOB, UpResult
from lab.progress import Progress, follow_steps

__all__ = ["failure_message", "run"]

_FAIL_GRACE_S = 10.0  # after a rank fails, how long the others get to say what they saw


def _show(
    progress: Progress, placement: dict[int, list[int]], per_node: bool
) -> Callable[[Event], None]:
    """Every rank's lines under one prefix (one per node under torchrun); rank 0's step records
    move the progress; set-up records tell which ranks landed on which node."""

    steps = follow_steps(progress)

    def show(event: Event) -> None:
        if isinstance(event, RecordEvent) and isinstance(event.record, ConfigRecord):
            ranks = placement.setdefault(event.node, [])
            if event.record.rank not in ranks:
                ranks.append(event.record.rank)
        if isinstance(event, LineEvent):
            who = f"node{event.node}"
            if event.rank is not None and not per_node:  # torchrun: one stream per node
                who += f"/rank{event.rank}"
            progress.write(f"[{who}] {event.text}")
            return
        steps(event)

    return show


def failure_message(job: Job) -> str:
    """Why a job ended early: the first failed rank's last lines, then the others'."""
    codes = job.codes
    failed = [r for r, c in codes.items() if c != 0]
    if not failed:
        return f"ranks {job.running} never finished"
    first = min(failed, key=lambda r: job.exits[r].t)
    lines = [
        f"rank {first} exited early with code {codes[first]}"
        + (f" while ranks {job.running} were still running" if job.running else "")
        + f"; its last lines:\n{job.last_lines(first, 15)}"
    ]
    # The survivors often say more than the rank that died (e.g. which peer went missing).
    for rank in failed:
        if rank != first:
            lines.append(
                f"  rank {rank} exited with code {codes[rank]}:\n{job.last_lines(rank, 3)}"
            )
    if job.tails.get(None):
        lines.append(f"  node messages:\n{job.last_lines(None, 15)}")
    lines.append(
        "Fix the cause above; if the image is stale, rebuild it with `python -m lab image`"
    )
    return "\n".join(lines)


def run(plan: UpPlan, echo: Callable[[str], None] = print) -> UpResult:
    """Start, train, collect into ``runs_dir/<run-id>/``, check parity; always clean up."""
    client = connect()
    started = time.monotonic()
    progress = Progress(plan.train.steps, enabled=plan.progress, echo=echo)
    run_id = new_run_id()
    run_dir = plan.runs_dir / run_id
    cluster = Cluster(
        client,
        plan.layout,
        image=plan.image,
        run_id=run_id,
        run_dir=run_dir,
        lifetime_s=plan.run_timeout_s + 300,
        echo=echo,
    )
    echo(
        f"run {run_id}: {plan.name} = {plan.layout.describe()}, image {plan.image}, "
        f"output in {run_dir}/"
    )
    sampler: ResourceSampler | None = None
    placement: dict[int, list[int]] = {}
    try:
        with cluster:
            sampler = ResourceSampler(cluster.nodes).start()
            show = _show(progress, placement, plan.launcher == "torchrun")
            if plan.launcher == "torchrun":
                job = cluster.torchrun(JOB, plan.train, plan.run_timeout_s, echo=show)
            else:
                job = cluster.train(JOB, plan.train, plan.run_timeout_s, echo=show)
            running = job.wait(plan.run_timeout_s + 30, fail_grace_s=_FAIL_GRACE_S)
            _write_yaml(run_dir / "topology.yaml", plan)
            _raise_if_unfinished(job, running, plan.run_timeout_s)
    finally:
        progress.close()
        if sampler is not None:
            sampler.stop()
    report = check_logs(run_dir / JOB / "logs")
    trained_from = job.first_record_t or job.started
    return UpResult(
        plan,
        cluster.run_id,
        run_dir,
        job.codes,
        {r: (e.cpu_s, e.peak_rss_mib) for r, e in job.exits.items()},
        report.holds,
        report.verdict,
        max(e.t for e in job.exits.values()) - trained_from,
        time.monotonic() - started,
        sampler,
        {n: sorted(r) for n, r in placement.items()},
    )


def _raise_if_unfinished(job: Job, running: list[int], timeout_s: float) -> None:
    """A rank failed before rank 0 gave its verdict, or the run outlived --run-timeout."""
    if job.verdict is not None and not running:
        return  # finished: parity may still be broken, which the report says
    if any(c != 0 for c in job.codes.values()):
        raise NodeFailed(failure_message(job))
    tails = "\n".join(f"  rank {r}:\n{job.last_lines(r, 3)}" for r in running)
    raise RunTimeout(
        f"run did not finish within {timeout_s:g} s; ranks still running: {running}. Last "
        f"lines:\n{tails}\nRaise --run-timeout for longer runs, or look for a stuck rank above"
    )


def _write_yaml(path: Path, plan: UpPlan) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"name": plan.name, **dataclasses.asdict(plan.layout), "train": plan.train.to_dict()}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
