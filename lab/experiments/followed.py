"""One training job of a sweep, run to its end: a progress line while it runs (from rank 0's
step records), then the rule every sweep holds its ranks to, so that a crash, a stuck rank or
a stale image stops the sweep with the rank's last lines instead of a table built on half a run.

Used by ``latency``, ``straggler``, ``compress``, ``memory`` and ``topology``: each job is
``cluster.train(...)``, followed with ``job.wait`` and judged from exit codes and records,
never from text.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ddp.torchfree import EndRecord, TrainConfig
from lab.engine.client import NodeFailed, RunTimeout
from lab.engine.cluster import Cluster
from lab.engine.events import Event
from lab.engine.job import Job
from lab.progress import Progress, follow_steps

__all__ = [
    "FAIL_GRACE_S",
    "WAIT_SLACK_S",
    "Bounds",
    "check_finished",
    "holds",
    "train_followed",
    "train_for_parity",
    "train_to_end",
]

FAIL_GRACE_S = 10.0  # after a rank fails, how long the others get to say what they saw
WAIT_SLACK_S = 30.0  # the launcher ends ranks at --run-timeout; the host waits this much more


class Bounds(Protocol):
    """What a sweep's plan says about each of its jobs: how long it may take, and whether a
    progress bar is shown."""

    run_timeout_s: float
    progress: bool


def train_followed(
    cluster: Cluster,
    name: str,
    cfg: TrainConfig,
    plan: Bounds,
    *,
    echo: Callable[[str], None],
    on_event: Callable[[Event], None] | None = None,
    fail_grace_s: float = FAIL_GRACE_S,
) -> tuple[Job, list[int]]:
    """Run job ``name`` with ``cfg`` on every rank under a progress line, within ``plan``'s run
    timeout; return it with the ranks still running, unjudged. ``on_event`` sees every event
    after the progress does (e.g. a step record that is the moment to change the link);
    ``fail_grace_s`` is how long the others get after a rank fails (a job where a rank killed
    for memory is an outcome gives its peers their collective timeout to notice)."""
    timeout_s = plan.run_timeout_s
    shown = Progress(cfg.steps, enabled=plan.progress, echo=echo)
    follow = follow_steps(shown)

    def followed(event: Event) -> None:
        follow(event)
        if on_event is not None:
            on_event(event)

    try:
        job = cluster.train(name, cfg, timeout_s, echo=followed)
        running = job.wait(timeout_s + WAIT_SLACK_S, fail_grace_s=fail_grace_s)
    finally:
        shown.close()
    return job, running


def train_to_end(
    cluster: Cluster,
    name: str,
    cfg: TrainConfig,
    plan: Bounds,
    *,
    where: str,
    slow_hint: str,
    echo: Callable[[str], None],
    broken_parity_ok: bool = False,
    on_event: Callable[[Event], None] | None = None,
) -> Job:
    """:func:`train_followed`, then held to :func:`check_finished`: the job once every rank
    finished. ``where`` names the job in errors."""
    job, running = train_followed(cluster, name, cfg, plan, echo=echo, on_event=on_event)
    check_finished(
        job,
        running,
        where=where,
        output=cluster.run_dir / name,
        timeout_s=plan.run_timeout_s,
        slow_hint=slow_hint,
        broken_parity_ok=broken_parity_ok,
    )
    return job


def train_for_parity(
    cluster: Cluster, name: str, cfg: TrainConfig, plan: Bounds, **follow: Any
) -> tuple[Job, bool]:
    """:func:`train_to_end` (``follow``: its keywords) for a sweep whose table reports parity
    instead of stopping on it (a no-sync floor or a link changed mid-job may break it): the
    job, and whether parity held, which takes rank 0's verdict and every rank's exit 0 (ddp
    exits 1 when it broke)."""
    job = train_to_end(cluster, name, cfg, plan, broken_parity_ok=True, **follow)
    return job, holds(job) and all(code == 0 for code in job.codes.values())


def check_finished(
    job: Job,
    running: list[int],
    *,
    where: str,
    output: Path,
    timeout_s: float,
    slow_hint: str,
    broken_parity_ok: bool = False,
) -> None:
    """Every rank wrote its end record and exited 0 (or 1, ddp's exit for broken parity, with
    ``broken_parity_ok``: the no-sync floor breaks it by design). Else ``RunTimeout`` (ranks
    still running; ``slow_hint`` says what to raise) or ``NodeFailed`` (a crash, the run
    timeout, an image without this ddp), with the ranks' last lines."""
    if running:
        tails = "\n".join(f"  rank {r}:\n{job.last_lines(r, 3)}" for r in running)
        raise RunTimeout(
            f"{where}: ranks {running} still running after {timeout_s:g} s; last lines:\n"
            f"{tails}\nraise --run-timeout ({slow_hint}), or look for a stuck rank (all "
            f"output in {output}/)"
        )
    finishing = (0, 1) if broken_parity_ok else (0,)
    for rank, code in job.codes.items():
        ended = any(isinstance(r, EndRecord) for r in job.records.get(rank, []))
        if code not in finishing or not ended:
            hint = " (stopped by --run-timeout)" if code in (124, 137) else ""
            raise NodeFailed(
                f"{where}: rank {rank} exited with code {code}{hint} before finishing; its last "
                f"lines:\n{job.last_lines(rank, 15)}\n(all output in {output}/; if the image "
                "is stale, `python -m lab image`)"
            )


def holds(job: Job) -> bool:
    """Rank 0's verdict said parity holds (no verdict: it did not)."""
    return job.verdict is not None and job.verdict.holds
