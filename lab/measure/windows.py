"""The measured window of a job: the steps every rank logged after the warm-up.

Why one definition: the warm-up steps hold gloo's connection set-up and the first buckets'
allocation, and a step only some ranks logged (a rank died, the log was cut) has no job-wide
time; every experiment's medians must be over the same steps, or their figures disagree.
"""

from __future__ import annotations

from collections.abc import Mapping

from ddp.torchfree import RankLog, StepRecord

__all__ = ["measured_steps", "slowest_ms"]


def measured_steps(
    logs: Mapping[int, RankLog], warmup: int, where: str = "logs"
) -> dict[int, list[StepRecord]]:
    """The steps after ``warmup`` that every rank logged, in step order, each with its ranks'
    records (in the logs' order). ValueError naming ``where`` when there are no logs or no such
    step (the message says what to do: run more steps)."""
    if not logs:
        raise ValueError(f"{where}: no rank logs")
    by_step: dict[int, list[StepRecord]] = {}
    for log in logs.values():
        for record in log.steps:
            if record.step > warmup:
                by_step.setdefault(record.step, []).append(record)
    full = {s: by_step[s] for s in sorted(by_step) if len(by_step[s]) == len(logs)}
    if not full:
        raise ValueError(
            f"{where}: no step after the {warmup} warm-up steps was logged by all "
            f"{len(logs)} ranks; run more --steps"
        )
    return full


def slowest_ms(steps: Mapping[int, list[StepRecord]]) -> list[float]:
    """Each measured step's job-wide time: its slowest rank's ``step_ms`` (the job waits for
    it in allreduce), in step order."""
    return [max(r.step_ms for r in recs) for _, recs in sorted(steps.items())]
