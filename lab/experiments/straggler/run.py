"""``lab straggler``'s run: one cluster, an unslowed baseline job, then the same job with the
straggler slowed (a CPU quota on its container, and/or a slower link into it).

Both jobs run in the same containers, one after the other, so the only difference between
them is the slowdown. Each is followed through its records (progress from rank 0's steps,
success from exits and the verdict); on the way out, also on errors and Ctrl-C, the cluster
collects the logs into ``runs/<run-id>/<job>/`` and removes everything it made.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from lab.engine.cluster import Cluster
from lab.experiments.followed import holds, train_to_end
from lab.experiments.straggler.plan import (
    BASELINE_JOB,
    CPU_PERIOD_US,
    SLOWED_JOB,
    StragglerPlan,
)
from lab.experiments.straggler.result import JobRun, StragglerResult
from lab.experiments.sweep import lifetime, sweep_cluster

__all__ = ["run"]


def _run_job(cluster: Cluster, plan: StragglerPlan, name: str, echo: Callable) -> JobRun:
    started = time.monotonic()
    slow = "a straggler with a tiny quota is slow"
    job = train_to_end(
        cluster, name, plan.train, plan, where=f"job {name}", slow_hint=slow, echo=echo
    )
    return JobRun(name, dict(job.codes), holds(job), time.monotonic() - started)


@contextlib.contextmanager
def _slowed(
    cluster: Cluster, plan: StragglerPlan, lifetime_s: float, echo, links: list[str]
) -> Iterator[None]:
    """The straggler's slowdown, applied for the slowed job and lifted after it; the verified
    link's line goes to ``links``."""
    with contextlib.ExitStack() as undo:
        if plan.quota is not None:
            cluster.set_cpus(plan.node, plan.quota, CPU_PERIOD_US)
            undo.callback(_lift_quota, cluster, plan.node, echo)
            echo(
                f"node{plan.node}: CPU quota {plan.quota:.3g} cores "
                f"({plan.quota * CPU_PERIOD_US / 1e3:.2f} ms per {CPU_PERIOD_US / 1e3:g} ms)"
            )
        if plan.slow_link_ms:
            from lab.experiments.straggler.link import slow_link

            links.append(undo.enter_context(slow_link(cluster, plan, lifetime_s)))
            echo(links[-1])
        yield


def _lift_quota(cluster: Cluster, node: int, echo: Callable[[str], None]) -> None:
    # Best effort: the containers are removed right after, and an error here must not hide
    # the one that ended the job (e.g. Ctrl-C).
    try:
        cluster.set_cpus(node, None, CPU_PERIOD_US)
    except Exception as e:
        echo(f"warning: could not lift node{node}'s CPU quota (removed with the run): {e}")


def _header(result: StragglerResult) -> str:
    plan = result.plan
    return (
        f"run {result.run_id}: {plan.nodes} nodes, model {plan.train.model}, "
        f"{plan.train.steps} steps, batch {plan.train.batch_size}; {plan.describe()}; "
        f"output in {result.run_dir}/"
    )


def run(plan: StragglerPlan, echo: Callable[[str], None] = print) -> StragglerResult:
    """Baseline, then the straggler, in one cluster that is always cleaned up."""
    lifetime_s = lifetime(2, plan.run_timeout_s)
    with sweep_cluster(
        plan,
        StragglerResult,
        _header,
        echo,
        lifetime_s=lifetime_s,
        net_admin=bool(plan.slow_link_ms),
    ) as (cluster, result):
        for name in (BASELINE_JOB, SLOWED_JOB):
            echo(f"job {name}: {'unslowed' if name == BASELINE_JOB else plan.describe()}")
            with contextlib.ExitStack() as stack:
                if name == SLOWED_JOB:
                    stack.enter_context(_slowed(cluster, plan, lifetime_s, echo, result.link_lines))
                job = _run_job(cluster, plan, name, echo)
            result.jobs[name] = job
            echo(
                f"job {name}: done in {job.seconds:.0f} s, parity "
                f"{'holds' if job.parity else 'BROKEN'}"
            )
    return result
