"""A configuration's numbers from its rank logs (``ddp.torchfree.RankLog``), and the table rows
derived by comparing configurations at one delay.

The logs are either collected from the run (``ddp.torchfree.load_run``) or built from the records
the ranks streamed while running; both are the same typed records. Pure: tested from synthetic
logs.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ddp.torchfree import RankLog, StepRecord

__all__ = ["ConfigStats", "Row", "derive_rows", "phase_groups", "summarize"]

Logs = Mapping[int, RankLog]


@dataclass(frozen=True)
class ConfigStats:
    """What one configuration's logs say, before comparing it with the others."""

    calls: int  # allreduce calls per measured step (the plan is rebuilt after step 1)
    median_step_ms: float
    median_comm_ms: float  # slowest rank's wait for allreduces after backward, median
    steps_measured: int
    auto_caps: tuple[float, ...] = ()  # bucket_cap_mb="auto": the cap chosen, per run


def _auto_cap(logs: Logs) -> float | None:
    """The cap ``bucket_cap_mb="auto"`` chose (the same on every rank)."""
    return next((log.auto_cap_mb for log in logs.values() if log.auto_cap_mb is not None), None)


def _calls(calls: set[int], auto: bool) -> int:
    """The allreduce calls per step of a configuration's runs: one number, but the auto cap
    may choose differently in different runs (then the most buckets, the worst case)."""
    if len(calls) != 1 and not (auto and calls):
        raise ValueError(f"runs of one configuration disagree on allreduce calls: {calls}")
    return max(calls)


def _complete_steps(logs: Logs, warmup: int, where: str) -> dict[int, list[StepRecord]]:
    """The measured steps every rank logged, by step."""
    by_step: dict[int, list[StepRecord]] = {}
    for log in logs.values():
        for record in log.steps:
            by_step.setdefault(record.step, []).append(record)
    measured = {s: recs for s, recs in by_step.items() if s > warmup and len(recs) == len(logs)}
    if not measured:
        raise ValueError(
            f"{where}: no step after the {warmup} warm-up steps was logged by all "
            f"{len(logs)} ranks; run more --steps"
        )
    return measured


def summarize(runs: Sequence[tuple[str, Logs]], warmup: int) -> ConfigStats:
    """Statistics of one configuration pooled over its runs (rounds), given as ``(where, logs)``
    (``where`` names the run in errors); each run's first ``warmup`` steps are left out. A
    step's time is its slowest rank's (the job waits for it). ValueError if the logs cannot
    give them."""
    calls: set[int] = set()
    step_ms: list[float] = []
    comm_ms: list[float] = []
    autos: list[float] = []
    for where, logs in runs:
        if not logs:
            raise ValueError(f"{where}: no rank logs")
        configs = [log.config for log in logs.values()]
        if any(c is None for c in configs):
            raise ValueError(f"{where}: a rank log has no config record (did the rank start?)")
        measured = _complete_steps(logs, warmup, where)
        counts = {r.num_buckets for recs in measured.values() for r in recs}
        if None in counts:  # logs of a ddp that did not record it: the construction plan
            counts = {c.num_buckets for c in configs if c is not None}
        calls.update(n for n in counts if n is not None)
        autos += [cap for cap in [_auto_cap(logs)] if cap is not None]
        step_ms += [max(r.step_ms for r in recs) for _, recs in sorted(measured.items())]
        comm_ms += [max(r.comm_ms for r in recs) for _, recs in sorted(measured.items())]
    return ConfigStats(
        calls=_calls(calls, bool(autos)),
        median_step_ms=statistics.median(step_ms),
        median_comm_ms=statistics.median(comm_ms),
        steps_measured=len(step_ms),
        auto_caps=tuple(autos),
    )


@dataclass(frozen=True)
class Row:
    """One line of the table / CSV. ``cap_mb`` and ``overlap`` are None for the no-sync floor,
    ``cap_mb`` "auto" for the auto cap (``auto_caps``: what it chose, per round); ``parity`` is
    None where it does not apply (no sync: replicas drift by design); ``phase`` the phase's
    key in a two-phase sweep; ``samples`` the global samples per optimizer step."""

    ms: float
    config: str
    cap_mb: float | str | None
    overlap: bool | None
    calls: int
    median_step_ms: float
    median_comm_ms: float
    steps_measured: int
    parity: bool | None
    exposed_comm_ms: float = math.nan
    speedup_vs_per_parameter: float = math.nan
    phase: str = ""
    accumulate: int = 1
    samples: int = 0
    auto_caps: tuple[float, ...] = ()

    @property
    def is_floor(self) -> bool:
        return self.cap_mb is None

    @property
    def is_auto(self) -> bool:
        return self.cap_mb == "auto"

    @property
    def is_bucketed(self) -> bool:
        """A fixed cap above 0 (not per-parameter, not the auto cap, not the floor)."""
        return isinstance(self.cap_mb, int | float) and self.cap_mb > 0

    @property
    def comm_ms_per_sample(self) -> float:
        """Communication wait per sample of the step: what accumulation divides by K."""
        return self.median_comm_ms / self.samples if self.samples else math.nan

    def ms_per_sample(self) -> float:
        return self.median_step_ms / self.samples if self.samples else self.median_step_ms

    @property
    def parity_text(self) -> str:
        return "n/a (no sync)" if self.parity is None else ("holds" if self.parity else "BROKEN")


def derive_rows(rows: list[Row]) -> list[Row]:
    """Fill exposed communication (not for accumulation: its floor would be K micro-batches)
    and speedup vs per-parameter (per sample), per latency value and phase."""
    out = []
    for row in rows:
        same = [r for r in rows if (r.ms, r.phase) == (row.ms, row.phase)]
        floor = next((r for r in same if r.is_floor), None)
        exposed = math.nan
        if floor and row.accumulate == 1:
            exposed = row.median_step_ms - floor.median_step_ms
        speedup = math.nan
        if not row.is_floor:
            base = next(
                (
                    r
                    for r in same
                    if r.cap_mb == 0 and r.overlap == row.overlap and r.accumulate == 1
                ),
                None,
            )
            if base is not None:
                speedup = base.ms_per_sample() / row.ms_per_sample()
        out.append(
            dataclasses.replace(row, exposed_comm_ms=exposed, speedup_vs_per_parameter=speedup)
        )
    return out


def phase_groups(rows: Sequence[Row], ms: float) -> list[list[Row]]:
    """The rows at delay ``ms``, one list per phase in run order (one list in a single-phase
    sweep): the ratios compare configurations within a phase, on one link and workload."""
    keys = dict.fromkeys(r.phase for r in rows if r.ms == ms)
    return [[r for r in rows if r.ms == ms and r.phase == key] for key in keys]
