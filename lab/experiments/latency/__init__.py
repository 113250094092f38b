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
import sys
import textwrap

from ddp.config import TrainConfig, flag_of
from ddp.flags import config_from_args
from lab import args as common
from lab.experiments.latency.console import DEFINITIONS
from lab.experiments.latency.plan import DEFAULT_CAPS, TRAIN_DEFAULTS, LatencyPlan
from lab.shaping.registry import CHOICES

NAME = "latency"
HELP = "inject link latency between containers; sweep bucket caps and overlap"
DESCRIPTION = (
    "Real delayed packets between four containers (netem, or an NFQUEUE delayer where the "
    "kernel has no netem), verified by a TCP probe, then per-parameter allreduce vs bucket "
    "caps, each with overlap on and off, plus a no-sync floor."
)


def _wrap(term: str) -> str:
    return textwrap.fill(
        f"{term} = {DEFINITIONS[term]}.", width=92, initial_indent="  ", subsequent_indent="    "
    )


EPILOG = "\n".join(
    [
        "The closing line is",
        "  bucketing speedup at <ms> ms: X.Xx (per-parameter vs best bucketed), overlap gain: Y.Yx",
        "where",
        *(_wrap(t) for t in ("bucketing speedup", "overlap gain", "exposed communication")),
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
_BACKWARD = next(f for f in dataclasses.fields(TrainConfig) if f.name == "backward_delay_ms")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ms", type=common.number(0), action="append",
        help="one-way delay per packet in ms (round trip +2x); repeat for several "
        "(default 5; 0 = unshaped)",
    )  # fmt: skip
    p.add_argument(
        "--shaper", choices=CHOICES, default="auto",
        help="auto: netem if the kernel has it, else the nfqueue delayer (default auto)",
    )  # fmt: skip
    p.add_argument("--rate-mbit", type=common.number(0, strict=True),
                   help="also limit each node's rate (tbf)")  # fmt: skip
    p.add_argument(
        "--node-ms", type=common.node_value, action="append", metavar="NODE:MS",
        help="this node's one-way delay instead of --ms (an asymmetric link, e.g. one slow "
        "node: 2:20); repeat for several",
    )  # fmt: skip
    common.add_impairments(p)
    p.add_argument(
        "--caps", type=common.float_list, default=DEFAULT_CAPS,
        help="bucket caps in MB, comma-separated; 0 = per parameter (default 0,0.25,1,4,25)",
    )  # fmt: skip
    p.add_argument(
        "--warmup", type=common.number(0, kind=int), default=2,
        help="first steps left out of the medians (gloo connection set-up) (default 2)",
    )  # fmt: skip
    p.add_argument(
        "--rounds", type=common.number(1, kind=int), default=2,
        help="run the whole plan this often, interleaved, and pool the steps: drift of the "
        "host's load then hits every configuration alike (default %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--backward-ms", dest="backward_delay_ms", type=common.number(0), default=0.0,
        metavar="MS", help=f"{_BACKWARD.metadata['help']} (ddp train's "
        f"{flag_of('backward_delay_ms')}; default 0)",
    )  # fmt: skip
    p.add_argument("--nodes", type=common.number(2, kind=int), default=4,
                   help="containers, one rank each (default 4)")  # fmt: skip
    p.add_argument(
        "--timeline-cap", type=common.number(0),
        help="cap (MB) of the Gantt chart (default: the fastest bucketed cap with overlap on)",
    )  # fmt: skip
    common.add_train_flags(p, _TRAIN_FIELDS, defaults=TRAIN_DEFAULTS)
    common.add_collective_timeout(p, TRAIN_DEFAULTS.collective_timeout_s)
    common.add_run_timeout(p, 300.0, "one configuration (one round of it)")
    common.add_common(p)


def plan(args: argparse.Namespace) -> LatencyPlan:
    fields = [*_TRAIN_FIELDS, "backward_delay_ms", "collective_timeout_s"]
    return LatencyPlan(
        ms=tuple(args.ms) if args.ms else (5.0,), shaper=args.shaper, rate_mbit=args.rate_mbit,
        caps=tuple(args.caps), warmup=args.warmup, rounds=args.rounds, nodes=args.nodes,
        train=config_from_args(args, fields, TRAIN_DEFAULTS), timeline_cap=args.timeline_cap,
        run_timeout_s=args.run_timeout, image=args.image, runs_dir=args.runs_dir,
        progress=args.progress, impair=common.impairments(args),
        node_ms=tuple(args.node_ms or ()),
    )  # fmt: skip


def run(plan: LatencyPlan):
    from lab.experiments.latency.sweep import run_sweep

    return run_sweep(plan)


def report(result) -> int:
    """Exit 0 when parity held in every allreduce configuration, else 1."""
    from lab.experiments.latency import console as text
    from lab.experiments.latency.files import write_outputs

    try:
        out = write_outputs(result)
    except ValueError as e:  # the collected logs cannot give the figures (LogError included)
        print(f"error: {e} (the logs are in {result.run_dir}/)", file=sys.stderr)
        return 1
    train = result.plan.train
    print(text.format_table(out.rows, result.plan.rate_mbit, train.backward_delay_ms))
    names = ", ".join(f.name for f in out.files)
    print(f"sweep took {result.seconds:.0f} s; wrote {result.run_dir}/: {names}")
    broken = [r.config for r in out.rows if r.parity is False]
    if broken:
        print(f"parity BROKEN in: {'; '.join(broken)}")
    for h in out.headlines:
        print(text.overlap_by_cap_line(out.rows, h.ms))
    for h in out.headlines:
        print(text.headline_line(h))
    return 1 if broken else 0
