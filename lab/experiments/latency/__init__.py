"""``python -m lab latency``: real link latency between containers, and what bucketing and
overlap do about it.

One cluster serves the whole sweep. For each link delay the nodes' links are shaped and
verified (:mod:`lab.shaping`), then every configuration (bucket cap x overlap, plus a no-sync
floor) trains as its own job: same model, seed, data and steps. The whole plan runs ``rounds``
times in a row and each configuration's steps are pooled, so a slow drift of the shared host's
load does not favour whichever configuration ran in a quiet minute.
"""

from __future__ import annotations

import argparse
import dataclasses
import textwrap

from ddp.torchfree import TrainConfig, config_from_args, flag_of
from lab import args as common
from lab.experiments.latency import page
from lab.experiments.latency.analysis import DEFINITIONS, analyse
from lab.experiments.latency.outputs import write_files
from lab.experiments.latency.phases import WORKLOAD
from lab.experiments.latency.plan import (
    DEFAULT_CAPS,
    DEFAULT_NODES,
    DEFAULT_RATE_MBIT,
    QUICK,
    TRAIN_DEFAULTS,
    LatencyPlan,
)
from lab.experiments.latency.result import SweepResult
from lab.experiments.latency.run import run as run  # the package's run(): see lab.experiments
from lab.experiments.latency.text import closing
from lab.experiments.link_change import ChangePlan, add_change_flags
from lab.report.report import report as report_sweep

NAME = "latency"
HELP = "inject link latency between containers; sweep bucket caps and overlap"
DESCRIPTION = (
    "Real delayed packets between containers (netem, or an NFQUEUE delayer where the "
    "kernel has no netem), verified by a TCP probe, then per-parameter allreduce vs bucket "
    "caps, each with overlap on and off, plus a no-sync floor."
)


_WORKLOAD = WORKLOAD  # the default's two phases, and why: .phases
# the terms of the closing line that the epilog defines
_TERMS = ("bucketing speedup", "overlap gain", "exposed communication", "comm ms/sample")

EPILOG = "\n".join(
    [
        textwrap.fill(_WORKLOAD, width=92),
        "",
        "The closing line is",
        "  bucketing speedup at <ms> ms: X.Xx (per-parameter vs best bucketed), overlap gain: Y.Yx",
        "and just before it, where they ran, the auto cap's and accumulation's lines:",
        "  auto cap at <ms> ms[, <phase> phase]: chose C MB (round 1), ..., N allreduces/step, ...",
        "  accumulation at <ms> ms: communication per sample Z.Zx lower with accumulate K (...)",
        "where",
        *common.definitions({t: DEFINITIONS[t] for t in _TERMS}),
        "Files in runs/<run-id>/: latency.csv, latency.json, latency.png (step time vs bucket",
        "cap), trace.json (Chrome trace: open in https://ui.perfetto.dev or chrome://tracing),",
        "gantt.png (one step, overlap on vs off), and per configuration and round a job",
        "directory <delay>-<configuration>-r<round>/ with logs/rank<R>.jsonl and node<N>.log.",
        "Exit codes: 0 parity held in every allreduce configuration, 1 parity broken or a run",
        "failed, 2 bad arguments, 130 interrupted.",
    ]
)

# The training settings the sweep leaves to the user; it varies cap, overlap and sync itself.
_TRAIN_FIELDS = ["model", "steps", "batch_size", "seed"]
_ROUNDS = 2
_OVERLAPS = {"both": (True, False), "on": (True,), "off": (False,)}
_BACKWARD = next(f for f in dataclasses.fields(TrainConfig) if f.name == "backward_delay_ms")


def _add_sweep_arguments(p: argparse.ArgumentParser) -> None:
    """What a single-phase sweep runs on its link: the caps, and overlap on, off or both."""
    p.add_argument(
        "--caps",
        type=common.cap_list,
        default=DEFAULT_CAPS,
        help="bucket caps in MB, comma-separated; 0 = per parameter, auto = the wrapper times "
        "the link and picks its own (default "
        f"{','.join(f'{c:g}' for c in DEFAULT_CAPS)})",
    )
    p.add_argument(
        "--overlap",
        choices=_OVERLAPS,
        default="both",
        help="which overlap settings each cap of a single-phase sweep runs with (default both)",
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ms",
        type=common.number(0),
        action="append",
        help="one-way delay per packet in ms (round trip +2x); repeat for several "
        "(default 5; 0 = unshaped)",
    )
    common.add_shaper(p)
    p.add_argument(
        "--rate-mbit",
        type=common.number(0),
        default=DEFAULT_RATE_MBIT,
        help="also limit each node's rate (tbf), so that communication is bandwidth-bound and "
        "serial, which is when overlap pays; 0 = no limit (default %(default)g)",
    )
    p.add_argument(
        "--node-ms",
        type=common.node_value,
        action="append",
        metavar="NODE:MS",
        help="this node's one-way delay instead of --ms (an asymmetric link, e.g. one slow "
        "node: 2:20); repeat for several",
    )
    common.add_impairments(p)
    add_change_flags(p)
    _add_sweep_arguments(p)
    common.add_warmup(p, 2, " (gloo connection set-up)")
    common.add_rounds(
        p,
        "run the whole plan this often, interleaved, and pool the steps: drift of the "
        f"host's load then hits every configuration alike (default {_ROUNDS})",
        _ROUNDS,
    )
    p.add_argument(
        "--backward-ms",
        dest="backward_delay_ms",
        type=common.number(0),
        default=0.0,
        metavar="MS",
        help="a model of accelerator compute, added to the real CPU compute: "
        f"{_BACKWARD.metadata['help']} (ddp train's {flag_of('backward_delay_ms')}; default 0)",
    )
    common.add_nodes(p, DEFAULT_NODES, ": a core per rank on a 2-core host")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"a first look: {QUICK['rounds']} round of {QUICK['steps']} steps (where --rounds "
        "and --steps are not given); both phases of the default, or with explicit settings caps "
        f"{','.join(f'{c:g}' for c in QUICK['caps'])} where --caps is not given",
    )
    common.add_cpus(p, "every node's CPU limit in cores (default: none)")
    p.add_argument(
        "--timeline-cap",
        type=common.number(0),
        help="cap (MB) of the Gantt chart (default: the fastest bucketed cap with overlap on)",
    )
    common.add_job_flags(p, _TRAIN_FIELDS, TRAIN_DEFAULTS, "one configuration (one round of it)")


def _phased(args: argparse.Namespace, train: TrainConfig) -> bool:
    """The default's two phases, unless a setting of the link or workload was given (the
    values left at their defaults: a single-phase sweep of every cap, overlap on and off)."""
    workload = (train.model, train.batch_size, train.backward_delay_ms)
    return (
        args.caps == DEFAULT_CAPS
        and args.rate_mbit == DEFAULT_RATE_MBIT
        and args.timeline_cap is None
        and args.overlap == "both"
        and workload == (TRAIN_DEFAULTS.model, TRAIN_DEFAULTS.batch_size, 0.0)
    )


def plan(args: argparse.Namespace) -> LatencyPlan:
    fields = [*_TRAIN_FIELDS, "backward_delay_ms", "collective_timeout_s"]
    train = config_from_args(args, fields, TRAIN_DEFAULTS)
    phased = _phased(args, train)
    if args.quick:  # only what was left at its default
        if not phased:
            args.caps = QUICK["caps"] if args.caps == DEFAULT_CAPS else args.caps
        args.rounds = QUICK["rounds"] if args.rounds == _ROUNDS else args.rounds
        if train.steps == TRAIN_DEFAULTS.steps:
            train = train.replace(steps=QUICK["steps"])
    return LatencyPlan(
        ms=tuple(args.ms) if args.ms else (5.0,),
        shaper=args.shaper,
        rate_mbit=args.rate_mbit or None,
        caps=tuple(args.caps),
        warmup=args.warmup,
        rounds=args.rounds,
        nodes=args.nodes,
        train=train,
        timeline_cap=args.timeline_cap,
        **common.run_fields(args),
        impair=common.impairments(args),
        node_ms=tuple(args.node_ms or ()),
        cpus=args.cpus,
        phased=phased,
        overlaps=_OVERLAPS[args.overlap],
        change=ChangePlan.from_args(args),
    )


def report(result: SweepResult) -> int:
    """Exit 0 when parity held in every allreduce configuration, else 1."""
    return report_sweep(
        result,
        analyse,
        files=write_files,
        console=closing,
        page=page.page,
        name=NAME,
        took="sweep took",
    )
