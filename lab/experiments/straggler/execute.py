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
from dataclasses import dataclass, field
from pathlib import Path

from lab.engine.client import connect
from lab.engine.cluster import Cluster
from lab.experiments.followed import train_to_end
from lab.experiments.straggler.plan import (
    BASELINE_JOB,
    CPU_PERIOD_US,
    SLOWED_JOB,
    StragglerPlan,
)

__all__ = ["JobRun", "StragglerResult", "run_straggler"]


@dataclass
class JobRun:
    name: str
    codes: dict[int, int]
    parity: bool
    seconds: float


@dataclass
class StragglerResult:
    plan: StragglerPlan
    run_id: str
    run_dir: Path
    jobs: dict[str, JobRun] = field(default_factory=dict)
    link_lines: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def log_dir(self, job: str) -> Path:
        return self.run_dir / job / "logs"


def _run_job(cluster: Cluster, plan: StragglerPlan, name: str, echo: Callable) -> JobRun:
    started = time.monotonic()
    job = train_to_end(
        cluster, name, plan.train, plan.run_timeout_s, progress=plan.progress, echo=echo,
        where=f"job {name}", slow_hint="a straggler with a tiny quota is slow",
    )  # fmt: skip
    parity = job.verdict is not None and job.verdict.holds
    return JobRun(name, dict(job.codes), parity, time.monotonic() - started)


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


def run_straggler(plan: StragglerPlan, echo: Callable[[str], None] = print) -> StragglerResult:
    """Baseline, then the straggler, in one cluster that is always cleaned up."""
    lifetime_s = 2 * (plan.run_timeout_s + 60) + 600  # bounds what lab leaves, should it die
    cluster = Cluster(connect(), plan.layout, image=plan.image, lifetime_s=lifetime_s,
                      net_admin=bool(plan.slow_link_ms), echo=echo)  # fmt: skip
    result = StragglerResult(plan, cluster.run_id, plan.runs_dir / cluster.run_id)
    cluster.run_dir = result.run_dir
    echo(
        f"run {cluster.run_id}: {plan.nodes} nodes, model {plan.train.model}, "
        f"{plan.train.steps} steps, batch {plan.train.batch_size}; {plan.describe()}; "
        f"output in {result.run_dir}/"
    )
    started = time.monotonic()
    try:
        with cluster:
            for name in (BASELINE_JOB, SLOWED_JOB):
                echo(f"job {name}: {'unslowed' if name == BASELINE_JOB else plan.describe()}")
                with contextlib.ExitStack() as stack:
                    if name == SLOWED_JOB:
                        stack.enter_context(
                            _slowed(cluster, plan, lifetime_s, echo, result.link_lines)
                        )
                    run = _run_job(cluster, plan, name, echo)
                result.jobs[name] = run
                echo(f"job {name}: done in {run.seconds:.0f} s, parity "
                     f"{'holds' if run.parity else 'BROKEN'}")  # fmt: skip
    finally:
        result.seconds = time.monotonic() - started
    return result
