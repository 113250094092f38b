"""``lab latency``'s run (:func:`lab.experiments.sweep.run_sweep`): per delay a shaped,
verified link; per configuration and round a training job followed through its records, its
statistics taken from the records the ranks streamed. With ``--change-at-step`` the link is a
:class:`lab.shaping.changing.ChangingLink`: re-shaped when rank 0 reports the step
(:mod:`lab.experiments.changed_job`), verified again once idle after the job, and shaped back
before the next one."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from ddp.torchfree import RankLog
from lab.engine.cluster import Cluster
from lab.experiments.changed_job import ChangeTrigger, recheck
from lab.experiments.followed import holds, train_to_end
from lab.experiments.latency.analysis import summarize
from lab.experiments.latency.link import link
from lab.experiments.latency.plan import LatencyPlan, Phase, Planned
from lab.experiments.latency.result import ConfigRun, LinkReport, SweepResult
from lab.experiments.latency.text import describe
from lab.experiments.link_change import recovery, step_points
from lab.experiments.sweep import run_sweep
from lab.shaping.changing import ChangingLink
from lab.words import count

__all__ = ["run"]


def _in(p: Planned) -> str:
    return f", {p.phase.title} phase" if p.phase and p.phase.key else ""


def _run_config(
    cluster: Cluster,
    plan: LatencyPlan,
    p: Planned,
    echo: Callable,
    trigger: ChangeTrigger | None = None,
) -> ConfigRun:
    started = time.monotonic()
    where = f"{p.conf.label} at {p.ms:g} ms{_in(p)} (round {p.round})"
    slow = "a low --rate-mbit makes steps slow"
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
    logs = {rank: RankLog(rank, records) for rank, records in job.records.items()}
    stats = summarize([(f"job {p.job}", logs)], plan.warmup)
    parity = None
    if not p.conf.is_floor:
        parity = holds(job) and all(code == 0 for code in job.codes.values())
    run = ConfigRun(
        p.conf, p.ms, p.round, p.job, job.codes, stats, parity, time.monotonic() - started, p.phase
    )
    if trigger is not None and trigger.fired:
        run.change = trigger.change
        run.recovery = recovery(
            step_points(logs), trigger.change.asked_step, trigger.change.applied_t, plan.warmup
        )
    return run


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


def _changing(held: dict[str, ChangingLink]) -> tuple[Callable, Callable]:
    """The sweep's link and job runner for a link that changes during each job: the phase's
    link held in ``held`` for the jobs, which change it and shape it back."""

    @contextlib.contextmanager
    def phase_link(
        cluster: Cluster, plan: LatencyPlan, phase: Phase, max_seconds: float
    ) -> Iterator[LinkReport]:
        with ChangingLink(cluster, plan.shaper, max_seconds, f"at {phase.ms:g} ms") as live:
            held["link"] = live
            rep = live.set(phase.ms, phase.rate_mbit)
            note = "\n".join(n for n in (phase.intro, rep.note if rep else "") if n)
            if rep is None:
                yield LinkReport(phase.ms, "none", note, "link unshaped (--ms 0)", phase=phase.key)
            else:
                measured, base = rep.measured, rep.baseline
                yield LinkReport(
                    phase.ms,
                    rep.shaper,
                    note,
                    rep.line(),
                    measured.get("p50_ms"),
                    measured.get("p90_ms"),
                    base.get("p50_ms"),
                    phase.key,
                )

    def run_job(cluster: Cluster, plan: LatencyPlan, p: Planned, echo: Callable) -> ConfigRun:
        live = held["link"]
        assert p.phase is not None and plan.change is not None
        again = live.ensure(p.phase.ms, p.phase.rate_mbit)
        if again is not None:
            echo(f"link shaped back: {again.line().splitlines()[0]}")
        trigger = ChangeTrigger(live, plan.change, echo)
        run = _run_config(cluster, plan, p, echo, trigger)
        if trigger.fired:
            idle = recheck(live, plan.change)
            if idle is not None:
                echo(f"  the changed link, idle after the job: {idle.line().splitlines()[0]}")
        return run

    return phase_link, run_job


def run(plan: LatencyPlan, echo: Callable[[str], None] = print) -> SweepResult:
    """Start the nodes, shape and verify each phase's link, run its configurations; the cluster
    collects the logs into ``runs_dir/<run-id>/<job>/`` and removes everything, always."""
    cpus = {n: plan.cpus for n in range(plan.nodes)} if plan.cpus else None
    phase_link, run_job = link, _run_config
    if plan.change is not None:
        phase_link, run_job = _changing({})
    return run_sweep(
        plan,
        plan.phases(),
        new_result=SweepResult,
        header=_header,
        link=phase_link,
        run_job=run_job,
        describe=describe,
        echo=echo,
        cpus=cpus,
    )
