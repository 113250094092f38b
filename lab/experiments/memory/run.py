"""``lab memory``'s run: each job in a fresh set of containers (so a container's memory
high-water mark is that job's), followed through its records, every node's eth0 counters
sampled while it runs (:mod:`lab.experiments.topology.counters`) and its memory read from the
engine after (:mod:`lab.engine.memory`).

First the three measured jobs, each of which must finish. Then, from their peaks, the limit
(:mod:`.limit`), and the two limited jobs: DDP with Adam, which should be killed for memory,
and the sharded run, which should finish with parity. Those two are followed to their end
whatever it is, since a kill is an expected outcome; how they ended is the report's to judge.
Every set of containers collects its logs into ``runs/<run-id>/<job>/`` and is removed on the
way out, also on errors and Ctrl-C.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ddp.torchfree import TrainConfig
from lab.engine.client import RunTimeout, connect
from lab.engine.cluster import Cluster
from lab.engine.memory import oom_kills, peak_mib, set_limit
from lab.engine.specs import new_run_id
from lab.experiments.followed import FAIL_GRACE_S, WAIT_SLACK_S, check_finished, holds
from lab.experiments.memory.limit import REFERENCE_NODE, choose_limits
from lab.experiments.memory.plan import CONFIGS, DDP, LIMITED, SHARDED, MemoryPlan
from lab.experiments.memory.result import JobRun, MemoryResult, NodeMemory
from lab.experiments.sweep import lifetime
from lab.experiments.topology.counters import sampled
from lab.progress import Progress, follow_steps

__all__ = ["run"]

_SAMPLER_SLACK_S = 120.0  # the sampler outlives the job's timeout by this, then ends itself
_SLOW = "the wide model's steps take seconds on a loaded host"


def _job(
    plan: MemoryPlan,
    result: MemoryResult,
    name: str,
    cfg: TrainConfig,
    limits: dict[int, float] | None,
    echo: Callable[[str], None],
) -> JobRun:
    """One job in its own containers; with ``limits`` (node -> MiB) under a memory limit, and
    then not required to finish."""
    started = time.monotonic()
    cluster = Cluster(
        connect(),
        plan.layout,
        image=plan.image,
        run_id=result.run_id,
        run_dir=result.run_dir,
        lifetime_s=lifetime(1, plan.run_timeout_s),
        echo=echo,
    )
    with cluster:
        for node in cluster.nodes:
            if limits and node.index in limits:
                set_limit(node.container, limits[node.index])
        since = time.time()
        timeout_s = plan.run_timeout_s
        shown = Progress(cfg.steps, enabled=plan.progress, echo=echo)
        with sampled(cluster, f"eth0-{name}", timeout_s + _SAMPLER_SLACK_S) as counters:
            try:
                job = cluster.train(name, cfg, timeout_s, echo=follow_steps(shown))
                # Under a limit a rank killed for memory is an outcome: its peers get their
                # collective timeout to notice and say so (gloo may not see the peer go).
                grace = cfg.collective_timeout_s + FAIL_GRACE_S if limits else FAIL_GRACE_S
                running = job.wait(timeout_s + WAIT_SLACK_S, fail_grace_s=grace)
            finally:
                shown.close()
        memory = {
            n.index: NodeMemory(
                peak_mib(n.container),
                (limits or {}).get(n.index),
                oom_kills(cluster.engines.client(n.index), n.container, since),
            )
            for n in cluster.nodes
        }
        if limits and running and not any(m.oom_kills for m in memory.values()):
            raise RunTimeout(
                f"{name}: ranks {running} still running after {timeout_s:g} s, and no rank was "
                f"killed for memory; raise --run-timeout ({_SLOW}), or look for a stuck rank"
            )
        if not limits:
            check_finished(
                job,
                running,
                where=name,
                output=result.run_dir / name,
                timeout_s=timeout_s,
                slow_hint=_SLOW,
            )
    return JobRun(
        name,
        dict(job.codes),
        holds(job),
        time.monotonic() - started,
        counters,
        memory,
    )


def _line(run: JobRun) -> str:
    peaks = ", ".join(
        f"node{n} {m.peak_mib:.0f}" if m.peak_mib is not None else f"node{n} ?"
        for n, m in sorted(run.memory.items())
    )
    if run.oom_nodes:
        end = f"killed for memory on {', '.join(f'node{n}' for n in run.oom_nodes)}"
    else:
        end = f"parity {'holds' if run.parity else 'BROKEN'}"
        if not run.finished:
            end += f", exits {run.codes}"
    return f"job {run.name}: {end}; peak MiB {peaks} ({run.seconds:.0f} s)"


def run(plan: MemoryPlan, echo: Callable[[str], None] = print) -> MemoryResult:
    """The three measured jobs, the limit chosen from them, the two limited jobs."""
    run_id = new_run_id()
    result = MemoryResult(plan, run_id, plan.runs_dir / run_id)
    echo(f"run {run_id}: {plan.describe()}; output in {result.run_dir}/")
    started = time.monotonic()
    try:
        for conf in CONFIGS:
            echo(f"job {conf.name}: {conf.label}")
            result.jobs[conf.name] = _job(
                plan, result, conf.name, conf.train(plan.train), None, echo
            )
            echo(_line(result.jobs[conf.name]))
        if not plan.limit:
            return result
        peaks = {
            c.name: {n: m.peak_mib for n, m in result.jobs[c.name].memory.items()}
            for c in (DDP, SHARDED)
        }
        try:
            result.limits = choose_limits(peaks[DDP.name], peaks[SHARDED.name], plan.limit_mib)
        except ValueError as e:
            result.limit_error = str(e)
            echo(f"no memory limit: {e}")
            return result
        held = ", ".join(f"node{n} {v:.0f}" for n, v in sorted(result.limits.items()))
        echo(f"memory limit (MiB): {held}; node{REFERENCE_NODE} (the parity reference) unlimited")
        for conf in (DDP, SHARDED):
            name = LIMITED[conf.name]
            echo(f"job {name}: {conf.label} under the limit, parity against the reference")
            cfg = conf.limited(plan.train)
            result.jobs[name] = _job(plan, result, name, cfg, result.limits, echo)
            echo(_line(result.jobs[name]))
        return result
    finally:
        result.seconds = time.monotonic() - started
