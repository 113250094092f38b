"""``python -m lab compress``: gradient compression under a bandwidth cap, and the rate below
which it pays.

One cluster serves the whole run. For each rate every node's egress is capped (tbf; with
``--ms`` every packet also delayed) and the link verified by the probe (its TCP bulk transfer
must reach the cap), then every comm hook trains as its own job: same model, seed, data and
steps, only ``comm_hook`` differs. The rounds interleave the hooks, and each hook's steps are
pooled over them.

One module, read top to bottom in the order data flows: the plan (pure, validated), the
result, the bytes per step each hook hands to the allreduce (derived, pure), the capped link
and the run on the engine, the analysis (pure but for reading the collected logs: one summary
object), then what is printed, the figure, the files and the page, each from that summary
alone; last the command's flags and :func:`report`.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import itertools
import json
import math
import statistics
import textwrap
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ddp.torchfree import (
    COMPRESSION_HOOKS,
    POWERSGD_RANK,
    POWERSGD_START_ITER,
    RankLog,
    Section,
    Table,
    Text,
    TrainConfig,
    config_from_args,
    load_run,
)
from lab import args as common
from lab.args import check_finite, check_job, check_warmup
from lab.engine.client import LabError
from lab.engine.cluster import Cluster
from lab.engine.layout import Layout
from lab.engine.specs import DEFAULT_IMAGE
from lab.experiments import timeline
from lab.experiments.followed import holds, train_to_end
from lab.experiments.sweep import run_sweep
from lab.measure.job_figures import JobFigures, job_figures
from lab.report.common import figures_section
from lab.report.report import Closing, SweepResult
from lab.report.report import report as report_sweep
from lab.report.results import Results, sweep_results
from lab.shaping.registry import CHOICES
from lab.shaping.verified_link import verified_link

__all__ = [
    "BASELINE",
    "DEFAULT_HOOKS",
    "DEFAULT_RATES",
    "DEFINITIONS",
    "MIN_COMPRESSION_RATE",
    "QUICK",
    "TRAIN_DEFAULTS",
    "CompressPlan",
    "CompressResult",
    "CompressSummary",
    "Crossover",
    "HookRun",
    "JobFigures",
    "LinkInfo",
    "Planned",
    "Row",
    "add_arguments",
    "analyse",
    "capped",
    "closing",
    "combine_rounds",
    "crossover_line",
    "crossover_lines",
    "crossovers",
    "derive_rows",
    "format_table",
    "job_figures",
    "job_payload_bytes",
    "page",
    "payload_bytes",
    "plan",
    "plot_compress",
    "report",
    "ring_factor",
    "run",
    "write_csv",
    "write_files",
]


# ``lab compress``'s plan: the bandwidth caps, the comm hooks trained at each, and the training
# config of every job, validated before any container exists.
#
# Jobs differ only in ``comm_hook``: each one's ``TrainConfig`` is the plan's base config with
# that field replaced (same model, seed, data, steps, bucket cap). At each rate every round runs
# every hook, ``none`` first, so a slow drift of the shared host's load hits all hooks alike.
# Pure: tested without Docker.

BASELINE = "none"  # the uncompressed allreduce every hook is compared with
# Mbit/s, each node's egress (tbf). The bridge itself carries ~9 Gbit/s here: 5000 is still a
# real cap, and the rate above which halving the bytes no longer pays on this host.
DEFAULT_RATES = (20.0, 100.0, 1000.0, 5000.0)
DEFAULT_HOOKS = COMPRESSION_HOOKS
# The deep MLP: 668,424 float32 parameters = 2.67 MB of gradient per step in 24 tensors, 22 of
# them 256 x 256 matrices (what PowerSGD compresses). At 20 Mbit/s a ring allreduce of that
# over 4 ranks (each sends 1.5 x 2.67 MB) takes ~1.6 s: communication dominates the ~10 ms of
# compute, so the cap decides the step time. Steps 1 and 2 are warm-up (gloo's connection
# set-up, and PowerSGD's plain-allreduce iterations): 10 measured steps per job and round.
TRAIN_DEFAULTS = TrainConfig(
    model="deep", steps=12, batch_size=64, seed=0, collective_timeout_s=60.0
)


@dataclass(frozen=True)
class Quick:
    """What ``--quick`` changes (each only where its flag was not given): about a minute."""

    # 2000, not 5000: under load the probe itself (Python, in the containers) reached only
    # 2.5 Gbit/s at a 5000 cap, below the check's 60%, and stopped the run.
    rates: tuple[float, ...] = (50.0, 2000.0)
    hooks: tuple[str, ...] = ("none", "fp16", "powersgd")  # bf16 sends what fp16 sends
    steps: int = 5
    rounds: int = 1
    nodes: int = 2


QUICK = Quick()


@dataclass(frozen=True)
class Planned:
    """One job of the plan, in run order."""

    rate_mbit: float
    round: int
    hook: str
    train: TrainConfig

    @property
    def job(self) -> str:
        """The job of one hook at one rate: ``runs/<run-id>/<job>/``."""
        return f"{self.rate_mbit:g}mbit-{self.hook}-r{self.round}"


@dataclass(frozen=True)
class CompressPlan:
    """What ``python -m lab compress`` measures, and its bounds."""

    rates: tuple[float, ...] = DEFAULT_RATES  # Mbit/s per node
    hooks: tuple[str, ...] = DEFAULT_HOOKS
    ms: float = 0.0  # one-way delay per packet on top of the cap
    shaper: str = "auto"
    warmup: int = POWERSGD_START_ITER  # first steps left out of the medians
    rounds: int = 2
    nodes: int = 4
    train: TrainConfig = field(default_factory=lambda: TRAIN_DEFAULTS)
    run_timeout_s: float = 300.0  # wall time of one job
    image: str = DEFAULT_IMAGE
    runs_dir: Path = Path("runs")
    progress: bool = True
    quick: bool = False

    def __post_init__(self) -> None:
        if not self.rates:
            raise ValueError("--rate-mbit is empty; e.g. --rate-mbit 20,100,1000")
        for rate in self.rates:
            check_finite("--rate-mbit", rate, 0.0, strict=True)
        if len(set(self.rates)) != len(self.rates):
            raise ValueError(f"--rate-mbit values repeat: {list(self.rates)}; give each once")
        unknown = [h for h in self.hooks if h not in COMPRESSION_HOOKS]
        if unknown or not self.hooks:
            raise ValueError(
                f"--comm-hooks must name some of {','.join(COMPRESSION_HOOKS)}, got "
                f"{','.join(self.hooks) or 'nothing'}"
            )
        if len(set(self.hooks)) != len(self.hooks):
            raise ValueError(f"--comm-hooks repeat: {','.join(self.hooks)}; name each once")
        if BASELINE not in self.hooks:
            raise ValueError(
                f"--comm-hooks must include {BASELINE}: every hook is compared with the "
                "uncompressed allreduce at the same rate"
            )
        check_finite("--ms", self.ms, 0.0)
        if self.shaper not in CHOICES:
            raise ValueError(f"--shaper must be one of {', '.join(CHOICES)}, got {self.shaper!r}")
        if "powersgd" in self.hooks and self.warmup < POWERSGD_START_ITER:
            raise ValueError(
                f"--warmup must be >= {POWERSGD_START_ITER} with powersgd: its first "
                f"{POWERSGD_START_ITER} steps run a plain allreduce, not compressed ones"
            )
        check_warmup(self.warmup, self.train.steps)
        if self.rounds < 1:
            raise ValueError(f"--rounds must be an integer >= 1, got {self.rounds!r}")
        if self.nodes < 2:
            raise ValueError(f"--nodes must be >= 2 (a link needs two ends), got {self.nodes}")
        if self.train.sync != "allreduce" or self.train.comm_hook != "none":
            raise ValueError("the base training config must be a plain allreduce (no hook)")
        check_job(self.train, self.run_timeout_s, self.nodes, "job")

    @property
    def layout(self) -> Layout:
        return Layout(self.nodes, 1)

    @property
    def rate_order(self) -> tuple[float, ...]:
        """Highest rate first: its link is the hardest for the probe to verify on a loaded
        host, so a check that fails stops the run before the slow low rates ran."""
        return tuple(sorted(self.rates, reverse=True))

    @property
    def ordered_hooks(self) -> tuple[str, ...]:
        """The baseline first, then the others in the order given."""
        return (BASELINE, *(h for h in self.hooks if h != BASELINE))

    def jobs(self, rate_mbit: float) -> list[Planned]:
        """The jobs at one rate: every round runs every hook."""
        return [
            Planned(rate_mbit, r, hook, self.train.replace(comm_hook=hook))
            for r in range(1, self.rounds + 1)
            for hook in self.ordered_hooks
        ]

    @property
    def total(self) -> int:
        return len(self.rates) * self.rounds * len(self.hooks)

    def describe(self) -> str:
        delay = f", {self.ms:g} ms one-way delay" if self.ms else ""
        rates = ", ".join(f"{r:g}" for r in self.rates)
        return (
            f"{self.nodes} nodes, model {self.train.model}, hooks {','.join(self.ordered_hooks)} "
            f"at {rates} Mbit/s{delay}; {self.rounds} round(s) x {self.train.steps} steps "
            f"({self.warmup} warm-up)"
        )


# What a run of ``lab compress`` produced, as plain data: the verified link of every rate and
# every job. Docker-free, so the report and its tests build on it without the engine.


@dataclass
class LinkInfo:
    """The verified link of one rate: the probe's line and what it measured."""

    rate_mbit: float
    shaper: str
    line: str
    note: str = ""
    measured_mbit: float | None = None  # the probe's TCP bulk transfer
    rtt_p50_ms: float | None = None
    baseline_rtt_p50_ms: float | None = None


@dataclass
class HookRun:
    """One job: a hook at a rate in one round; how its ranks exited, whether the replicas
    stayed identical (ddp's verdict), and what each node's interface sent during it."""

    rate_mbit: float
    round: int
    hook: str
    job: str
    codes: dict[int, int]
    parity: bool
    seconds: float
    tx_bytes: dict[int, int] = field(default_factory=dict)  # node -> eth0 bytes sent in the job


class CompressResult(SweepResult[CompressPlan, LinkInfo, HookRun]):
    """The run: the verified link of every rate, every job in run order."""


# Bytes per step, derived from the buckets a run reported (``ConfigRecord.bucket_shapes``) and
# what each comm hook hands to the allreduce. Pure.
#
# Per rank and step, the *payload* is what the collectives are given:
#
# * ``none``: each bucket's float32 gradients plus one float32 count per parameter (ddp's
#   unused-parameter counts ride in the bucket's tail: :mod:`ddp.wrapper.reducer`);
# * ``fp16``/``bf16``: the gradients as 2-byte floats (with a hook the counts live apart and are
#   only reduced with ``find_unused_parameters``, which the deep MLP does not use);
# * ``powersgd`` (rank r, torch's ``powerSGD_hook``): a gradient viewed as an n x m matrix
#   (n = its first dimension) is compressed when ``(n + m) r x 2 < n m`` (torch's
#   ``min_compression_rate`` 2) and then sends P (n x r) and Q (m x r) in float32; the rest
#   (biases) go uncompressed in float32. Three allreduces per bucket instead of one.
#
# On the wire, a ring allreduce (gloo's algorithm for these sizes: reduce-scatter, then
# all-gather) makes every rank send ``2 (N - 1) / N`` times the payload. That factor is the
# algorithm's, not a measurement; the run also reports what each node's interface really sent.

MIN_COMPRESSION_RATE = 2  # torch's PowerSGDState default
Shapes = Sequence[Sequence[Sequence[int]]]  # per bucket, per parameter, its shape


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1


def _powersgd_elements(shape: Sequence[int], rank: int) -> int:
    n = shape[0] if shape else 1
    m = _numel(shape) // n if n else 0
    r = min(n, m, rank)
    if (n + m) * r * MIN_COMPRESSION_RATE < n * m:
        return (n + m) * r  # P and Q
    return n * m  # sent as it is


def payload_bytes(hook: str, shapes: Shapes, rank: int = POWERSGD_RANK) -> int:
    """Bytes one rank hands to the allreduces of one (compressed) step. ``"plain"``: a hook's
    uncompressed allreduce (powersgd's first steps): float32 gradients, no counts."""
    total = 0
    for bucket in shapes:
        numel = sum(_numel(s) for s in bucket)
        if hook == "none":
            total += 4 * (numel + len(bucket))
        elif hook == "plain":
            total += 4 * numel
        elif hook in ("fp16", "bf16"):
            total += 2 * numel
        elif hook == "powersgd":
            total += 4 * sum(_powersgd_elements(s, rank) for s in bucket)
        else:
            raise ValueError(f"no byte count for comm hook {hook!r}")
    return total


def job_payload_bytes(hook: str, shapes: Shapes, steps: int) -> int:
    """Bytes one rank hands to the gradient allreduces over a whole job of ``steps`` steps:
    powersgd's first ``POWERSGD_START_ITER`` steps are plain allreduces."""
    if hook != "powersgd":
        return steps * payload_bytes(hook, shapes)
    plain = min(steps, POWERSGD_START_ITER)
    return plain * payload_bytes("plain", shapes) + (steps - plain) * payload_bytes(hook, shapes)


def ring_factor(world_size: int) -> float:
    """What each rank sends per payload byte in a ring allreduce: ``2 (N - 1) / N``."""
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    return 2 * (world_size - 1) / world_size


# The link at one rate: every node's egress capped (tbf) and, with ``--ms``, every packet
# delayed, verified by the probe (:func:`lab.shaping.link.shaped`: the delay on TCP echoes, the
# rate on a TCP bulk transfer) for as long as the jobs at that rate run
# (:func:`lab.shaping.verified_link.verified_link`).


@contextlib.contextmanager
def capped(
    cluster: Cluster, plan: CompressPlan, rate_mbit: float, max_seconds: float
) -> Iterator[LinkInfo]:
    """Shape every node at ``rate_mbit`` (and ``plan.ms``), yield what was measured, undo."""
    with verified_link(
        cluster,
        f"at {rate_mbit:g} Mbit/s",
        plan.ms,
        plan.shaper,
        rate_mbit,
        max_seconds=max_seconds,
    ) as rep:
        yield LinkInfo(
            rate_mbit,
            rep.shaper,
            rep.line(),
            rep.note,
            rep.bulk.get("mbit_s"),
            rep.measured.get("p50_ms"),
            rep.baseline.get("p50_ms"),
        )


# ``lab compress``'s run (:func:`lab.experiments.sweep.run_sweep`): per rate (highest first)
# a capped, verified link; per round and hook a training job followed through its records,
# success from the exits and ddp's verdict. Around each job every node's eth0 byte counter is
# read, so what compression saves on the wire is measured, not only derived.

_TX = ["cat", "/sys/class/net/eth0/statistics/tx_bytes"]


def _tx_bytes(cluster: Cluster) -> dict[int, int]:
    out = {}
    for node in cluster.nodes:
        text = cluster.check(node.index, _TX, "read eth0's byte counter").strip()
        try:
            out[node.index] = int(text)
        except ValueError:
            raise LabError(f"node{node.index}: eth0's tx_bytes is not a number: {text!r}") from None
    return out


def _run_job(cluster: Cluster, plan: CompressPlan, p: Planned, echo: Callable) -> HookRun:
    started = time.monotonic()
    before = _tx_bytes(cluster)
    where = f"{p.hook} at {p.rate_mbit:g} Mbit/s (round {p.round})"
    slow = "a low --rate-mbit makes steps slow"
    job = train_to_end(cluster, p.job, p.train, plan, where=where, slow_hint=slow, echo=echo)
    after = _tx_bytes(cluster)
    tx = {n: after[n] - before[n] for n in before}
    return HookRun(
        p.rate_mbit,
        p.round,
        p.hook,
        p.job,
        dict(job.codes),
        holds(job),
        time.monotonic() - started,
        tx,
    )


def _describe(run: HookRun, done: int, total: int) -> str:
    mb = max(run.tx_bytes.values(), default=0) / 1e6
    return (
        f"[{done:>2}/{total}] {run.rate_mbit:g} Mbit/s round {run.round}  {run.hook:<9} "
        f"parity {'holds' if run.parity else 'BROKEN'}  busiest node sent {mb:.1f} MB  "
        f"({run.seconds:.0f} s)"
    )


def run(plan: CompressPlan, echo: Callable[[str], None] = print) -> CompressResult:
    """Start the nodes, cap and verify each rate, run every hook; the cluster collects the
    logs into ``runs_dir/<run-id>/<job>/`` and removes everything, always."""
    return run_sweep(
        plan,
        plan.rate_order,
        new_result=CompressResult,
        link=capped,
        run_job=_run_job,
        describe=_describe,
        echo=echo,
    )


# ``lab compress``'s figures from the rank logs (``ddp.torchfree.RankLog``): one row per rate and
# hook, each compared with ``none`` at the same rate, and the crossover of every hook;
# :func:`analyse` turns a run's result into the one :class:`CompressSummary` the files, the
# console text and the page are built from. Pure but for reading the collected logs: tested from
# synthetic logs.

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


# What ``lab compress`` prints, from the run's summary: the table (one block per rate, with the
# probe's measured rate) and the crossover lines. Pure.


def _num(value: float, fmt: str, suffix: str = "") -> str:
    return "-" if value is None or math.isnan(value) else format(value, fmt) + suffix


def _link_text(rate: float, links: Sequence[LinkInfo]) -> str:
    link = next((lk for lk in links if lk.rate_mbit == rate), None)
    if link is None or link.measured_mbit is None:
        return "link not measured"
    rtt = f", round trip p50 {link.rtt_p50_ms:.2f} ms" if link.rtt_p50_ms is not None else ""
    return f"probe measured {link.measured_mbit:.1f} Mbit/s{rtt}"


def _pad(r: Row) -> int:
    # the bracket of "sent MB/job" is left-aligned: fill it to 8 characters
    return max(0, 6 - len(_num(r.job_wire_mb, ".1f")))


def format_table(rows: Sequence[Row], plan: CompressPlan, links: Sequence[LinkInfo] = ()) -> str:
    header = (
        f"{'hook':<9}{'step ms':>9}{'per round':>12}{'speedup':>9}{'wire MB/step':>13}"
        f"{'sent MB/job':>18}{'final loss':>11}{'vs exact':>10}{'vs none':>10}"
        f"{'max|dparam|':>12}  replicas"
    )
    delay = f", {plan.ms:g} ms one-way delay" if plan.ms else ""
    lines = [
        f"{plan.nodes} ranks, model {plan.train.model}, medians over "
        f"{plan.train.steps - plan.warmup} steps x {plan.rounds} round(s); wire MB/step: "
        "derived, per rank; sent MB/job: measured on the busiest node (derived)"
    ]
    for rate in dict.fromkeys(r.rate_mbit for r in rows):
        lines += [f"cap {rate:g} Mbit/s per node{delay} ({_link_text(rate, links)}):", header]
        for r in (r for r in rows if r.rate_mbit == rate):
            lines.append(
                f"{r.hook:<9}{r.median_step_ms:>9.1f}"
                f"{'/'.join(f'{m:.0f}' for m in r.round_step_ms):>12}"
                f"{_num(r.speedup_vs_none, '.2f', 'x'):>9}"
                f"{_num(r.wire_mb, '.3f'):>13}"
                f"{_num(r.job_sent_mb, '.1f'):>10} ({_num(r.job_wire_mb, '.1f')}){'':<{_pad(r)}}"
                f"{r.final_loss:>11.5f}"
                f"{_num(r.loss_vs_exact, '+.1e'):>10}{_num(r.loss_vs_none, '+.1e'):>10}"
                f"{_num(r.max_param_diff, '.1e'):>12}  "
                f"{'identical' if r.parity else 'DIVERGED'}"
            )
    return "\n".join(lines)


def crossover_line(c: Crossover) -> str:
    """One hook's answer to "at which rate does compression start to pay"."""
    if not c.rates:
        return f"{c.hook}: no rate with both it and none measured"
    measured = ", ".join(f"{s:.2f}x at {r:g}" for r, s in zip(c.rates, c.speedups, strict=True))
    if not c.pays_at:
        verdict = f"never beats none at the measured rates ({c.rates[0]:g}..{c.rates[-1]:g})"
    elif len(c.pays_at) == len(c.rates):
        verdict = f"beats none at every measured rate, up to {c.highest:g} Mbit/s"
    elif c.lowest == c.highest:
        verdict = f"beats none at {c.lowest:g} Mbit/s only (measured)"
    else:
        verdict = f"beats none at {c.lowest:g}..{c.highest:g} Mbit/s (measured)"
    cross = "; ".join(
        f"crosses 1.0x at ~{x:.0f} Mbit/s (interpolated between {lo:g} and {hi:g})"
        for lo, hi, x in c.crossings
    )
    return f"{c.hook}: {verdict}" + (f"; {cross}" if cross else "") + f" [speedup {measured}]"


def crossover_lines(cs: Sequence[Crossover]) -> list[str]:
    return ["crossover (speedup vs none, Mbit/s):", *(f"  {crossover_line(c)}" for c in cs)]


def closing(summary: CompressSummary) -> Closing:
    """The table and the crossover, before the 'took' line and what diverged."""
    result = summary.result
    table = format_table(summary.rows, result.plan, result.links)
    return Closing([table, *crossover_lines(summary.crossovers)])


# ``compress.png``: step time and speedup vs rate per hook, and what each hook costs in final
# loss and parameter distance. Pure (matplotlib's Agg backend, no display).


def _finite(rows: Sequence[Row], attr: str) -> list[Row]:
    return [r for r in rows if math.isfinite(getattr(r, attr))]


def plot_compress(path: Path, rows: Sequence[Row], cs: Sequence[Crossover], title: str) -> None:
    """Left: median step time vs rate (log-log), one line per hook. Middle: speedup vs none,
    the 1.0x line and each interpolated crossover marked. Right: per hook (at the lowest rate,
    round 1; the same at every rate) the final loss minus none's, and the max |param diff| vs
    the exact single process on a log axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hooks = list(dict.fromkeys(r.hook for r in rows))
    color = {h: f"C{i}" for i, h in enumerate(hooks)}
    fig, (ax_t, ax_s, ax_q) = plt.subplots(1, 3, figsize=(15, 4.8), dpi=100)
    for hook in hooks:
        pts = sorted((r.rate_mbit, r.median_step_ms) for r in rows if r.hook == hook)
        ax_t.plot(*zip(*pts, strict=True), "-o", color=color[hook], label=hook)
        sp = sorted(
            (r.rate_mbit, r.speedup_vs_none)
            for r in _finite(rows, "speedup_vs_none")
            if r.hook == hook
        )
        if sp and hook != "none":
            ax_s.plot(*zip(*sp, strict=True), "-o", color=color[hook], label=hook)
    for c in cs:
        for _, _, x in c.crossings:
            ax_s.axvline(x, color=color[c.hook], linestyle=":", linewidth=1)
            ax_s.annotate(
                f"{c.hook} ~{x:.0f}",
                (x, 1.0),
                textcoords="offset points",
                xytext=(-2, 6),
                fontsize=8,
                color=color[c.hook],
                rotation=90,
                ha="right",
                va="bottom",
            )
    for ax in (ax_t, ax_s):
        ax.set_xscale("log")
        ax.set_xlabel("link cap per node (Mbit/s, log scale)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("median step time (ms, log scale)")
    ax_t.set_title("step time vs bandwidth", fontsize=10)
    ax_s.set_yscale("log")
    ax_s.axhline(1.0, color="black", linewidth=0.8)
    ax_s.set_ylabel("speedup vs none (log; >1: compression pays)")
    ax_s.set_title("speedup vs none; dotted: interpolated crossover", fontsize=10)

    _plot_price(ax_q, rows, color)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _plot_price(ax_q, rows: Sequence[Row], color: dict[str, str]) -> None:
    """Per hook at the lowest rate: final loss minus none's (bars), max |param diff| vs the
    exact single process (dots, log axis on the right)."""
    lowest = min(r.rate_mbit for r in rows)
    at = [r for r in rows if r.rate_mbit == lowest]
    xs = range(len(at))
    ax_q.bar(
        xs,
        [0.0 if math.isnan(r.loss_vs_none) else r.loss_vs_none for r in at],
        color=[color[r.hook] for r in at],
    )
    ax_q.set_xticks(list(xs), [r.hook for r in at])
    ax_q.axhline(0.0, color="black", linewidth=0.8)
    ax_q.set_ylabel("final loss minus none's (bars)")
    ax_q.set_title("price: final loss (bars), max |param diff| vs exact (dots)", fontsize=10)
    ax_d = ax_q.twinx()
    diffs = [
        (i, r.max_param_diff)
        for i, r in enumerate(at)
        if math.isfinite(r.max_param_diff) and r.max_param_diff > 0
    ]
    if diffs:
        ax_d.plot(*zip(*diffs, strict=True), "kD", markersize=6)
        for i, d in diffs:
            ax_d.annotate(
                f"{d:.1e}",
                (i, d),
                textcoords="offset points",
                xytext=(6, 0),
                fontsize=8,
                va="center",
            )
        ax_d.set_yscale("log")
    ax_d.set_ylabel("max |param diff| vs exact single process (log)")


# The files of a ``lab compress`` run in ``runs/<run-id>/``, from its summary: ``compress.txt``
# (the table and the crossover), ``compress.csv``, ``compress.json`` (definitions, settings,
# links, every job), ``compress.png`` and ``trace.json`` (one representative step of every hook at
# the lowest rate, from the step records' bucket timings).


def _blank(value: object) -> object:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _jsonable(value: object) -> object:
    if isinstance(value, float) and math.isnan(value):
        return None  # null: not measured
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def write_csv(path: Path, rows: list[Row]) -> None:
    names = [f.name for f in dataclasses.fields(Row)]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=names)
        writer.writeheader()
        writer.writerows({k: _blank(v) for k, v in dataclasses.asdict(r).items()} for r in rows)


def write_files(summary: CompressSummary) -> list[Path]:
    """Every file of the run; the paths written."""
    result, rows, cs = summary.result, summary.rows, summary.crossovers
    plan, run_dir = result.plan, result.run_dir
    files = []

    def path(name: str) -> Path:
        files.append(run_dir / name)
        return files[-1]

    table = format_table(rows, plan, result.links)
    path("compress.txt").write_text("\n".join([table, *crossover_lines(cs)]) + "\n")
    write_csv(path("compress.csv"), rows)
    delay = f", {plan.ms:g} ms one-way delay" if plan.ms else ""
    plot_compress(
        path("compress.png"),
        rows,
        cs,
        f"{plan.nodes} ranks, model {plan.train.model}, gradient compression "
        f"under a bandwidth cap{delay}",
    )
    if summary.traced:
        path("trace.json").write_text(json.dumps(timeline.chrome_trace(summary.traced)))
    settings = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)}
    settings["train"] = plan.train.to_dict()
    doc = {
        "run_id": result.run_id,
        "settings": settings,
        "definitions": DEFINITIONS,
        "links": [dataclasses.asdict(link) for link in result.links],
        "rows": [dataclasses.asdict(r) for r in rows],
        "crossovers": [
            {**dataclasses.asdict(c), "lowest": c.lowest, "highest": c.highest} for c in cs
        ],
        "runs": [dataclasses.asdict(run) for run in result.runs],
        "seconds": round(result.seconds, 1),
        "files": [f.name for f in files] + ["compress.json"],
    }
    path("compress.json").write_text(json.dumps(_jsonable(doc), indent=2) + "\n")
    return files


# ``lab compress``'s page: where each hook pays as the headline, the table per rate and hook,
# the crossover, the figure, the verified links and every rank's exit. From the run's summary.

_HEADERS = (
    "rate Mbit/s",
    "hook",
    "median step ms",
    "per round",
    "speedup vs none",
    "wire MB/step",
    "sent MB/job",
    "final loss",
    "vs exact",
    "vs none",
    "max|dparam|",
    "replicas",
)
_FILES = [
    ("compress.txt", "the table and the crossover"),
    ("compress.csv", "the table"),
    ("compress.json", "settings, definitions, links, every job"),
    ("trace.json", "Chrome trace of each hook's representative step"),
]


def _pays(c: Crossover) -> str:
    if not c.pays_at:
        return f"{c.hook} never pays"
    if c.lowest == c.highest:
        return f"{c.hook} pays at {c.lowest:g} Mbit/s"
    return f"{c.hook} pays at {c.lowest:g}..{c.highest:g} Mbit/s"


def page(summary: CompressSummary) -> Results:
    """The page and the run's summary.json fields."""
    result = summary.result
    rows = [
        [
            r.rate_mbit,
            r.hook,
            r.median_step_ms,
            "/".join(f"{m:.0f}" for m in r.round_step_ms),
            r.speedup_vs_none,
            r.wire_mb,
            r.job_sent_mb,
            r.final_loss,
            r.loss_vs_exact,
            r.loss_vs_none,
            r.max_param_diff,
            "identical" if r.parity else "DIVERGED",
        ]
        for r in summary.rows
    ]
    links = [
        [lk.rate_mbit, lk.shaper, lk.measured_mbit, lk.rtt_p50_ms, lk.baseline_rtt_p50_ms, lk.line]
        for lk in result.links
    ]
    plan = result.plan
    sections = [
        Section(
            "Per rate and hook",
            [
                Table(
                    _HEADERS,
                    rows,
                    f"{plan.nodes} ranks, model {plan.train.model}; medians over the rounds",
                )
            ],
        ),
        Section("Crossover", [Text([crossover_line(c) for c in summary.crossovers])]),
        figures_section(result.run_dir, [("compress.png", "step time and price per rate")]),
        Section(
            "Links, as the probe measured them",
            [
                Table(
                    (
                        "rate Mbit/s",
                        "shaper",
                        "measured Mbit/s",
                        "rtt p50 ms",
                        "unshaped p50 ms",
                        "probe",
                    ),
                    links,
                )
            ],
        ),
    ]
    figure = "; ".join(_pays(c) for c in summary.crossovers if c.hook != "none")
    headline = (summary.broken, "replicas identical in every job", figure)
    configs = {f"{r.rate_mbit:g} Mbit/s, {r.hook}": r.median_step_ms for r in summary.rows}
    ranks = {r.job: r.codes for r in result.runs}
    return sweep_results("compress", result, sections, ranks, headline, configs, _FILES)


# The command: its flags, the plan from them, and the report.

NAME = "compress"
HELP = "gradient compression (fp16, bf16, powersgd) under a bandwidth cap: where it pays"
DESCRIPTION = textwrap.fill(
    "Caps every node's link at each --rate-mbit (verified by a TCP bulk transfer), then trains "
    "the same job once per comm hook: the uncompressed allreduce (none), fp16 and bf16 (half "
    "the bytes), powersgd (a rank-1 approximation of each weight matrix). Reports per rate and "
    "hook the median step time, the speedup vs none, the bytes each rank sends per step, the "
    "final loss and what compression costs in parity (vs the exact single process and vs the "
    "uncompressed run), and the crossover: the rate above which a hook no longer pays. The "
    "deep MLP's gradient is 2.67 MB per step (668,424 float32 in 24 tensors), so at low rates "
    "the allreduce, not the compute, sets the step time.",
    width=92,
)
EPILOG = "\n".join(
    [
        "The table's figures:",
        *common.definitions(DEFINITIONS),
        f"Warm-up: the first --warmup steps (default {POWERSGD_START_ITER}) are left out: "
        "step 1 sets up gloo's",
        f"connections, and powersgd runs a plain allreduce for its first "
        f"{POWERSGD_START_ITER} steps (torch's",
        "start_powerSGD_iter), so every measured powersgd step is a compressed one.",
        "Files in runs/<run-id>/: compress.txt (the table), compress.csv, compress.json,",
        "compress.png (step time vs rate per hook; final loss and param diff per hook),",
        "trace.json (Chrome trace of one step per hook at the lowest rate:",
        "https://ui.perfetto.dev), and per job <rate>mbit-<hook>-r<round>/ with",
        "logs/rank<R>.jsonl and node<N>.log.",
        "Exit codes: 0 every job finished with identical replicas, 1 a job failed or the",
        "replicas diverged, 2 bad arguments, 130 interrupted.",
    ]
)
_TRAIN_FIELDS = ["model", "steps", "batch_size", "seed", "bucket_cap_mb"]


def _hooks(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rate-mbit",
        type=common.float_list,
        metavar="R[,R...]",
        help="each node's egress cap in Mbit/s, comma-separated (default 20,100,1000,5000; "
        f"--quick {','.join(f'{r:g}' for r in QUICK.rates)})",
    )
    p.add_argument(
        "--comm-hooks",
        type=_hooks,
        metavar="H[,H...]",
        help=f"comm hooks to compare, comma-separated, none among them (default "
        f"{','.join(COMPRESSION_HOOKS)}; --quick {','.join(QUICK.hooks)})",
    )
    p.add_argument(
        "--ms",
        type=common.number(0),
        default=0.0,
        help="one-way delay per packet on top of the cap (default 0)",
    )
    common.add_shaper(p)
    common.add_warmup(
        p,
        POWERSGD_START_ITER,
        ": gloo's set-up and powersgd's uncompressed steps",
        ", the least with powersgd",
    )
    common.add_rounds(
        p,
        "run every hook this often per rate, interleaved, and pool the steps (default 2; "
        f"--quick {QUICK.rounds})",
    )
    common.add_nodes(p, None, f"; --quick {QUICK.nodes}", shown=CompressPlan.nodes)
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"about a minute: {QUICK.nodes} nodes, rates "
        f"{','.join(f'{r:g}' for r in QUICK.rates)}, hooks {','.join(QUICK.hooks)}, "
        f"{QUICK.rounds} round (each only where its flag is not given) of {QUICK.steps} steps "
        "(overrides --steps)",
    )
    common.add_job_flags(p, _TRAIN_FIELDS, TRAIN_DEFAULTS, "one job")


def plan(args: argparse.Namespace) -> CompressPlan:
    train = config_from_args(args, [*_TRAIN_FIELDS, "collective_timeout_s"], TRAIN_DEFAULTS)
    quick = args.quick
    if quick:
        train = train.replace(steps=QUICK.steps)
    rates = args.rate_mbit or (QUICK.rates if quick else CompressPlan.rates)
    rounds = args.rounds or (QUICK.rounds if quick else CompressPlan.rounds)
    nodes = args.nodes or (QUICK.nodes if quick else CompressPlan.nodes)
    hooks = args.comm_hooks or (QUICK.hooks if quick else CompressPlan.hooks)
    return CompressPlan(
        rates=tuple(rates),
        hooks=tuple(hooks),
        ms=args.ms,
        shaper=args.shaper,
        warmup=args.warmup,
        rounds=rounds,
        nodes=nodes,
        train=train,
        **common.run_fields(args),
        quick=quick,
    )


def report(result: CompressResult) -> int:
    """Exit 0 when every job kept its replicas identical, else 1."""
    return report_sweep(result, analyse, files=write_files, console=closing, page=page, name=NAME)
