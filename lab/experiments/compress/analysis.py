"""``lab compress``'s figures from the rank logs (``ddp.torchfree.RankLog``): one row per rate and
hook, each compared with ``none`` at the same rate, and the crossover of every hook;
:func:`analyse` turns a run's result into the one :class:`CompressSummary` the files, the
console text and the page are built from. Pure but for reading the collected logs: tested from
synthetic logs.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ddp.torchfree import RankLog, load_run
from lab.experiments import timeline
from lab.experiments.compress.plan import BASELINE
from lab.experiments.compress.result import CompressResult, HookRun
from lab.experiments.compress.wire import job_payload_bytes, payload_bytes, ring_factor
from lab.measure.windows import measured_steps, slowest_ms

__all__ = [
    "DEFINITIONS",
    "CompressSummary",
    "Crossover",
    "JobFigures",
    "Row",
    "analyse",
    "combine_rounds",
    "crossovers",
    "derive_rows",
    "job_figures",
]

Logs = Mapping[int, RankLog]

DEFINITIONS = {
    "median step ms": (
        "per measured step (warm-up excluded) the slowest rank's step_ms, since the job waits "
        "for it; the median over the steps of every round"
    ),
    "per round": (
        "each round's own median step time: how much the shared host's load moved the figure "
        "between rounds"
    ),
    "speedup vs none": "none's median step time at the same rate divided by this hook's",
    "payload MB/step": (
        "bytes one rank hands to the allreduces per step, derived from the run's bucket "
        "shapes (its config record) and the hook: float32 gradients plus one count per "
        "parameter for none, 2 bytes per gradient for fp16/bf16, float32 P and Q of every "
        "compressed matrix plus the uncompressed biases for powersgd"
    ),
    "wire MB/step": (
        "what each rank sends per step in a ring allreduce, 2 (N - 1) / N x the payload: "
        "derived from the algorithm, not measured"
    ),
    "sent MB/job": (
        "measured: eth0's tx_bytes of the busiest node over the whole job (median over rounds); "
        "in brackets the same derived, steps x wire MB/step with powersgd's first steps "
        "uncompressed: the difference is set-up (the parameter broadcast, model check, "
        "rendezvous), the per-step gather of losses and TCP/IP headers"
    ),
    "final loss": (
        "the global-batch loss of the last step (the mean of the ranks' equal-shard losses)"
    ),
    "loss vs exact": "final loss minus the exact single-process reference's at that step",
    "loss vs none": "final loss minus none's at the same rate (same data and steps)",
    "max |dparam| vs exact": (
        "ddp's verdict figure: the largest parameter difference from the exact single process "
        "over all steps; none's own is float rounding, so for a hook it is also its distance "
        "from the uncompressed run to within that"
    ),
    "crossover": (
        "the rate at which a hook's speedup vs none crosses 1, linearly interpolated in log "
        "rate and log speedup between the two measured rates around it (an estimate: only "
        "the measured rates are measurements)"
    ),
}


@dataclass(frozen=True)
class JobFigures:
    """What one job's logs say, before comparing it with the other hooks."""

    step_ms: list[float]  # the measured steps' slowest-rank times
    final_loss: float
    ref_final_loss: float | None
    max_param_diff: float | None
    world_size: int
    bucket_shapes: list[list[list[int]]] | None


def job_figures(logs: Logs, warmup: int, where: str) -> JobFigures:
    """ValueError naming ``where`` if the logs cannot give the figures."""
    if not logs:
        raise ValueError(f"{where}: no rank logs")
    configs = [log.config for log in logs.values()]
    if any(c is None for c in configs):
        raise ValueError(f"{where}: a rank log has no config record (did the rank start?)")
    complete = measured_steps(logs, warmup, where)
    measured = slowest_ms(complete)
    last = complete[max(complete)]
    ref = [r for r in last if r.ref_loss is not None]
    diffs = [
        r.max_param_diff for log in logs.values() for r in log.steps if r.max_param_diff is not None
    ]
    first = configs[0]
    assert first is not None
    return JobFigures(
        step_ms=measured,
        final_loss=statistics.fmean(r.loss for r in last),
        ref_final_loss=ref[0].ref_loss if ref else None,
        max_param_diff=max(diffs) if diffs else None,
        world_size=first.world_size,
        bucket_shapes=first.bucket_shapes,
    )


@dataclass(frozen=True)
class Row:
    """One line of the table / CSV: a hook at a rate, over its rounds."""

    rate_mbit: float
    hook: str
    median_step_ms: float
    round_step_ms: tuple[float, ...]  # each round's median: how far the host's load moved it
    steps_measured: int
    final_loss: float
    loss_vs_exact: float
    max_param_diff: float  # vs the exact single process (NaN: no reference)
    payload_mb: float  # per step, derived (NaN: the logs carry no bucket shapes)
    wire_mb: float  # per step, derived
    job_wire_mb: float  # per job, derived
    job_sent_mb: float  # per job, measured on the busiest node's eth0 (NaN: not read)
    parity: bool  # replicas identical in every round
    speedup_vs_none: float = math.nan
    loss_vs_none: float = math.nan


def _nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


def make_row(
    rate_mbit: float,
    hook: str,
    jobs: Sequence[JobFigures],
    sent_mb: Sequence[float],
    parity: bool,
    steps: int,
) -> Row:
    """A hook's row at one rate from its rounds' figures (final loss and diffs from round 1:
    every round trains the same seed and data)."""
    measured = [ms for job in jobs for ms in job.step_ms]
    first = jobs[0]
    payload = wire = job_wire = math.nan
    if first.bucket_shapes is not None:
        ring = ring_factor(first.world_size)
        payload = payload_bytes(hook, first.bucket_shapes) / 1e6
        wire = payload * ring
        job_wire = job_payload_bytes(hook, first.bucket_shapes, steps) / 1e6 * ring
    ref = first.ref_final_loss
    return Row(
        rate_mbit,
        hook,
        statistics.median(measured),
        tuple(statistics.median(job.step_ms) for job in jobs),
        len(measured),
        first.final_loss,
        first.final_loss - ref if ref is not None else math.nan,
        _nan(first.max_param_diff),
        payload,
        wire,
        job_wire,
        statistics.median(sent_mb) if sent_mb else math.nan,
        parity,
    )


def derive_rows(rows: list[Row]) -> list[Row]:
    """Fill the comparison with ``none`` at the same rate."""
    out = []
    for row in rows:
        base = next((r for r in rows if r.rate_mbit == row.rate_mbit and r.hook == BASELINE), None)
        if base is None:
            out.append(row)
            continue
        out.append(
            dataclasses.replace(
                row,
                speedup_vs_none=base.median_step_ms / row.median_step_ms,
                loss_vs_none=row.final_loss - base.final_loss,
            )
        )
    return out


@dataclass(frozen=True)
class Crossover:
    """Where a hook beats ``none``: the measured rates, and the interpolated crossings."""

    hook: str
    rates: tuple[float, ...]  # measured, ascending
    speedups: tuple[float, ...]
    pays_at: tuple[float, ...]  # measured rates with speedup > 1
    crossings: tuple[tuple[float, float, float], ...]  # (lower rate, upper rate, interpolated)

    @property
    def lowest(self) -> float | None:
        return min(self.pays_at, default=None)

    @property
    def highest(self) -> float | None:
        return max(self.pays_at, default=None)


def _crossing(r0: float, s0: float, r1: float, s1: float) -> float:
    """Where log speedup is 0 on the line through (log r0, log s0), (log r1, log s1)."""
    a, b = math.log(s0), math.log(s1)
    x0, x1 = math.log(r0), math.log(r1)
    return math.exp(x0 + (x1 - x0) * a / (a - b))


def crossovers(rows: Sequence[Row]) -> list[Crossover]:
    """Per hook other than ``none`` (in row order), from its speedups at the measured rates."""
    out = []
    for hook in dict.fromkeys(r.hook for r in rows if r.hook != BASELINE):
        pts = sorted(
            (r.rate_mbit, r.speedup_vs_none)
            for r in rows
            if r.hook == hook and math.isfinite(r.speedup_vs_none)
        )
        crossings = []
        for (r0, s0), (r1, s1) in itertools.pairwise(pts):
            if (s0 > 1) != (s1 > 1) and s0 != 1 and s1 != 1:
                crossings.append((r0, r1, _crossing(r0, s0, r1, s1)))
        out.append(
            Crossover(
                hook,
                tuple(r for r, _ in pts),
                tuple(s for _, s in pts),
                tuple(r for r, s in pts if s > 1),
                tuple(crossings),
            )
        )
    return out


def combine_rounds(result: CompressResult) -> list[Row]:
    """One row per (rate, hook), lowest rate first: steps pooled over its rounds from the
    collected logs."""
    groups: dict[tuple[float, str], list[HookRun]] = {}
    for run in sorted(result.runs, key=lambda run: run.rate_mbit):  # stable: hook order kept
        groups.setdefault((run.rate_mbit, run.hook), []).append(run)
    rows = []
    for (rate, hook), group in groups.items():
        jobs = [
            job_figures(load_run(result.log_dir(run)), result.plan.warmup, str(result.log_dir(run)))
            for run in group
        ]
        sent = [max(run.tx_bytes.values()) / 1e6 for run in group if run.tx_bytes]
        parity = all(run.parity for run in group)
        rows.append(make_row(rate, hook, jobs, sent, parity, result.plan.train.steps))
    return derive_rows(rows)


def _traced(result: CompressResult) -> list[timeline.StepTimeline]:
    """Round 1 at the lowest rate: every hook's step closest to its median."""
    lowest = min(result.plan.rates)
    lines = []
    for run in result.runs:
        if run.rate_mbit != lowest or run.round != 1:
            continue
        logs, where = load_run(result.log_dir(run)), str(result.log_dir(run))
        step = timeline.representative_step(logs, result.plan.warmup, where)
        lines.append(timeline.load_step(logs, step, f"{lowest:g} Mbit/s, {run.hook}", where))
    return lines


@dataclass
class CompressSummary:
    """Everything ``lab compress`` reports about one run: the rows, every hook's crossover,
    each hook's representative step at the lowest rate; and the result they came from."""

    result: CompressResult
    rows: list[Row]
    crossovers: list[Crossover]
    traced: list[timeline.StepTimeline]

    @property
    def broken(self) -> str:
        broken = [f"{r.hook} at {r.rate_mbit:g} Mbit/s" for r in self.rows if not r.parity]
        return f"replicas DIVERGED in: {'; '.join(broken)}" if broken else ""


def analyse(result: CompressResult) -> CompressSummary:
    """The run's summary from the collected logs; ValueError if they cannot give it."""
    rows = combine_rounds(result)
    return CompressSummary(result, rows, crossovers(rows), _traced(result))
