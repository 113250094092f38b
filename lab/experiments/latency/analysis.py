"""``lab latency``'s figures: a configuration's numbers from its rank logs
(``ddp.torchfree.RankLog``), the table rows derived by comparing configurations at one delay,
the two ratios of the headline, and the Gantt chart's pair; :func:`analyse` turns a sweep's
result into the one :class:`LatencySummary` the files, the console text and the page are built
from.

The logs are either collected from the run (``ddp.torchfree.load_run``) or built from the records
the ranks streamed while running; both are the same typed records. Pure but for reading the
collected logs: tested from synthetic logs.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ddp.torchfree import RankLog, load_run
from lab.experiments import timeline
from lab.experiments.latency.bucket_stats import ConfigTiming, time_buckets
from lab.experiments.latency.result import ConfigRun, ConfigStats, SweepResult
from lab.measure.windows import measured_steps, slowest_ms

__all__ = [
    "DEFINITIONS",
    "ConfigStats",
    "Gantt",
    "Headline",
    "LatencySummary",
    "Row",
    "analyse",
    "combine_rounds",
    "default_timeline_cap",
    "derive_rows",
    "headline",
    "phase_groups",
    "summarize",
    "timeline_phase",
]

DEFINITIONS = {
    "median step time": (
        "for every measured step (warm-up steps excluded: they include gloo's connection "
        "set-up) the slowest rank's step_ms, since the job waits for it; then the median "
        "over steps"
    ),
    "exposed communication": (
        "median step time minus that of the no-sync floor at the same link delay (same steps, "
        "same data, no communication): what communication adds to a step after any overlap"
    ),
    "speedup vs per-parameter": (
        "the per-parameter (cap 0) median step time per sample with the same overlap setting "
        "(in the same phase) divided by this configuration's"
    ),
    "comm ms/sample": (
        "the median communication wait (the slowest rank's wait for allreduces after "
        "backward) per sample of the optimizer step: accumulating K micro-batches "
        "divides it by about K"
    ),
    "bucketing speedup": (
        "the faster per-parameter configuration (overlap on or off) divided by the fastest "
        "bucketed one (any fixed cap > 0, overlap on or off), in the first phase that ran both "
        "(the default's latency-bound phase, where both have overlap on)"
    ),
    "overlap gain": (
        "the fastest configuration with overlap off divided by the fastest with overlap on, "
        "each over every fixed cap (per-parameter included), in the first phase that ran both "
        "(the default's bandwidth-bound phase): what overlap buys once the cap is tuned for "
        "each setting"
    ),
}

Logs = Mapping[int, RankLog]


def _auto_cap(logs: Logs) -> float | None:
    """The cap ``bucket_cap_mb="auto"`` chose (the same on every rank)."""
    return next((log.auto_cap_mb for log in logs.values() if log.auto_cap_mb is not None), None)


def _calls(calls: set[int], auto: bool) -> int:
    """The allreduce calls per step of a configuration's runs: one number, but the auto cap
    may choose differently in different runs (then the most buckets, the worst case)."""
    if len(calls) != 1 and not (auto and calls):
        raise ValueError(f"runs of one configuration disagree on allreduce calls: {calls}")
    return max(calls)


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
        measured = measured_steps(logs, warmup, where)
        counts = {r.num_buckets for recs in measured.values() for r in recs}
        if None in counts:  # logs of a ddp that did not record it: the construction plan
            counts = {c.num_buckets for c in configs if c is not None}
        calls.update(n for n in counts if n is not None)
        autos += [cap for cap in [_auto_cap(logs)] if cap is not None]
        step_ms += slowest_ms(measured)
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


def _row(result: SweepResult, group: list[ConfigRun]) -> Row:
    """One configuration's row: its rounds' steps pooled from the collected logs, parity
    required in every round."""
    logs = [(str(result.log_dir(run)), load_run(result.log_dir(run))) for run in group]
    stats = summarize(logs, result.plan.warmup)
    parities = [run.parity for run in group]
    run = group[0]
    conf, train = run.conf, (run.phase.train if run.phase else result.plan.train)
    return Row(
        run.ms,
        conf.label,
        conf.cap_mb,
        conf.overlap,
        stats.calls,
        stats.median_step_ms,
        stats.median_comm_ms,
        stats.steps_measured,
        None if None in parities else all(parities),
        phase=run.phase_key,
        accumulate=conf.accumulate,
        samples=train.batch_size * conf.accumulate,
        auto_caps=stats.auto_caps,
    )


def combine_rounds(result: SweepResult) -> list[Row]:
    """One row per (delay, phase, configuration), in run order."""
    groups: dict[tuple[float, str, str], list[ConfigRun]] = {}
    for run in result.runs:
        groups.setdefault((run.ms, run.phase_key, run.conf.name), []).append(run)
    return derive_rows([_row(result, group) for group in groups.values()])


@dataclass(frozen=True)
class Headline:
    """The two ratios of the closing line at one delay, and the configurations each compares."""

    ms: float
    bucketing_speedup: float
    per_parameter: str
    best_bucketed: str
    overlap_gain: float
    best_no_overlap: str
    best_overlap: str


def _fastest(rows: list[Row]) -> Row | None:
    return min(rows, key=lambda r: r.median_step_ms, default=None)


def _ratio_in(
    groups: list[list[Row]], slow: Callable[[Row], bool], fast: Callable[[Row], bool]
) -> tuple[float, str, str]:
    """Fastest of ``slow``'s rows over fastest of ``fast``'s, in the first group with both."""
    for rows in groups:
        a, b = _fastest([r for r in rows if slow(r)]), _fastest([r for r in rows if fast(r)])
        if a and b:
            return a.median_step_ms / b.median_step_ms, a.config, b.config
    return math.nan, "-", "-"


def headline(rows: list[Row], ms: float) -> Headline:
    """The two ratios of the closing line at latency ``ms`` (NaN where a side was not run),
    each within one phase, over fixed caps without accumulation."""
    groups = [
        [r for r in g if not r.is_floor and not r.is_auto and r.accumulate == 1]
        for g in phase_groups(rows, ms)
    ]
    bucketing = _ratio_in(groups, lambda r: r.cap_mb == 0, lambda r: r.is_bucketed)
    overlap = _ratio_in(groups, lambda r: r.overlap is False, lambda r: r.overlap is True)
    return Headline(ms, *bucketing, *overlap)


def timeline_phase(rows: Sequence[Row], ms: float) -> str:
    """The phase of the Gantt chart at ``ms``: the first that ran a cap with overlap on and off
    (the default's bandwidth-bound phase), else the last."""
    groups = phase_groups(rows, ms)
    for group in groups:
        if {r.overlap for r in group if r.is_bucketed or r.cap_mb == 0} >= {True, False}:
            return group[0].phase
    return groups[-1][0].phase if groups else ""


def default_timeline_cap(rows: Sequence[Row], ms: float, phase: str = "") -> float | None:
    """The fastest bucketed cap with overlap on at ``ms`` (in ``phase``) among those with
    several buckets (one bucket has nothing to overlap: its allreduce starts when backward
    ends): the configuration a user would pick, shown beside the same cap with overlap off."""
    fixed = [r for r in rows if r.ms == ms and r.phase == phase and r.accumulate == 1]
    fixed = [r for r in fixed if r.is_bucketed or r.cap_mb == 0]
    bucketed = [r for r in fixed if r.cap_mb and r.overlap and r.calls > 1]
    if not bucketed:
        bucketed = [r for r in fixed if r.cap_mb and r.overlap]
    if not bucketed:
        bucketed = fixed
    best = min(bucketed, key=lambda r: r.median_step_ms, default=None)
    return None if best is None else best.cap_mb  # type: ignore[return-value]


@dataclass
class Gantt:
    """Round 1 at the largest delay: every allreduce configuration's representative step
    (``traced``, the Chrome trace), and the pair of ``cap`` in ``phase``, overlap on and off
    (``pair``, the Gantt chart) with its per-bucket ``timings``. ``ms`` None: nothing ran."""

    ms: float | None = None
    cap_mb: float | None = None
    phase: str = ""
    steps: dict[str, int] = field(default_factory=dict)  # configuration -> the step shown
    traced: list[timeline.StepTimeline] = field(default_factory=list)
    pair: list[timeline.StepTimeline] = field(default_factory=list)
    timings: list[ConfigTiming] = field(default_factory=list)


def _title(run: ConfigRun) -> str:
    phase = f"{run.phase.title}, " if run.phase and run.phase_key else ""
    return f"{run.ms:g} ms, {phase}{run.conf.label}"


def _gantt(result: SweepResult, rows: list[Row]) -> Gantt:
    ms = max((r.ms for r in rows), default=None)
    if ms is None:
        return Gantt()
    phase = timeline_phase(rows, ms)
    cap = result.plan.timeline_cap
    if cap is None:
        cap = default_timeline_cap(rows, ms, phase)
    gantt = Gantt(ms, cap, phase)
    warmup = result.plan.warmup
    for run in result.runs:
        if run.ms != ms or run.round != 1 or run.conf.is_floor:
            continue
        logs, where = load_run(result.log_dir(run)), str(result.log_dir(run))
        step = timeline.representative_step(logs, warmup, where)
        gantt.steps["-".join(k for k in (run.phase_key, run.conf.name) if k)] = step
        conf = run.conf
        traced = timeline.load_step(logs, step, _title(run), where, bool(conf.overlap))
        gantt.traced.append(traced)
        if conf.cap_mb == cap and run.phase_key == phase and conf.accumulate == 1:
            gantt.pair.append(traced)
            gantt.timings.append(time_buckets(logs, warmup, conf.label, bool(conf.overlap), where))
    return gantt


@dataclass
class LatencySummary:
    """Everything ``lab latency`` reports about one sweep: the rows, the headline of every
    delay, the Gantt chart's pair; and the result they came from."""

    result: SweepResult
    rows: list[Row]
    headlines: list[Headline]
    gantt: Gantt

    @property
    def broken(self) -> str:
        broken = [r.config for r in self.rows if r.parity is False]
        return f"parity BROKEN in: {'; '.join(broken)}" if broken else ""


def analyse(result: SweepResult) -> LatencySummary:
    """The sweep's summary from the collected logs; ValueError if they cannot give it."""
    rows = combine_rounds(result)
    headlines = [headline(rows, ms) for ms in dict.fromkeys(r.ms for r in rows)]
    return LatencySummary(result, rows, headlines, _gantt(result, rows))
