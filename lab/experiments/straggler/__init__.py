"""``python -m lab straggler``: one slow rank makes every rank slow, because the gradient
allreduce is a barrier.

One cluster runs the same training twice: an unslowed baseline, then with one rank's container
under a real CPU quota (and/or a slower link into it). Every rank's step time rises to the
straggler's: the fast ranks finish their backward early and then wait in the allreduce, which
cannot complete before the slowest rank's gradients arrive. The report splits each rank's step
into compute and waiting, beside the baseline, and draws one step of each job as a Gantt chart.
"""

from __future__ import annotations

import argparse
import textwrap

from ddp.torchfree import config_from_args
from lab import args as common
from lab.experiments.straggler import page
from lab.experiments.straggler.analysis import DEFINITIONS, analyse
from lab.experiments.straggler.outputs import write_files
from lab.experiments.straggler.plan import QUICK_STEPS, TRAIN_DEFAULTS, StragglerPlan
from lab.experiments.straggler.result import StragglerResult
from lab.experiments.straggler.run import run as run  # the package's run(): see lab.experiments
from lab.experiments.straggler.text import closing
from lab.report.report import report as report_sweep

NAME = "straggler"
HELP = "slow one rank (a CPU quota, or a slow link): every rank's step rises to its step"
DESCRIPTION = textwrap.fill(
    "An unslowed baseline, then the same training with one rank's container under a real CPU "
    "quota (cgroup CFS, not a sleep) and/or a slower link into it. Why every rank slows down: "
    "the gradient allreduce is a barrier. A fast rank launches its buckets' allreduces during "
    "backward, but none of them can complete before the straggler has contributed its "
    "gradients, so the fast rank finishes its backward and then waits; every step takes as "
    "long as the slowest rank's. DDP cannot hide a straggler; only balancing the work can.",
    width=92,
)
EPILOG = "\n".join(
    [
        "The table gives, per rank, medians over the measured steps:",
        *common.definitions(DEFINITIONS),
        "The closing line is",
        "  straggler rank R: its compute X.Xx slower, every rank's step Y.Yx (A -> B ms); the",
        "  others wait W ms per step in allreduce",
        "('its link slower' instead of the compute figure when only --slow-link-ms is given).",
        "--slowdown X gives the straggler X times less CPU than its fair share (host cores /",
        "nodes; 0.5 core for 4 nodes on 2 cores): a quota above the share slows nothing. The",
        "measured compute slowdown is printed beside it (a loaded host gives less than asked).",
        "Files in runs/<run-id>/: straggler.csv, straggler.json, trace.json (Chrome trace:",
        "https://ui.perfetto.dev), gantt.png (one step unslowed above, slowed below), and",
        "baseline/ and straggler/ with logs/rank<R>.jsonl and node<N>.log.",
        "Exit codes: 0 both jobs finished with parity, 1 a job failed or parity broke, 2 bad",
        "arguments, 130 interrupted.",
    ]
)

_TRAIN_FIELDS = ["model", "steps", "batch_size", "seed", "bucket_cap_mb"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rank", type=common.number(0, kind=int), default=1, help="the straggler (default 1)"
    )
    p.add_argument(
        "--slowdown",
        type=common.number(1),
        metavar="X",
        help="CPU quota = fair share / X on the straggler's container (default 4, or 1 = no "
        "quota when --slow-link-ms is given)",
    )
    common.add_cpus(p, "the straggler's CPU quota in cores, instead of --slowdown")
    p.add_argument(
        "--slow-link-ms",
        type=common.number(0),
        default=0.0,
        metavar="MS",
        help="extra one-way delay on every packet into the straggler's node only (default 0)",
    )
    common.add_shaper(p, "for --slow-link-ms: netem, or the nfqueue delayer")
    common.add_impairments(p, "every node's link in the slowed job (with --slow-link-ms)")
    common.add_nodes(p, 4)
    common.add_warmup(p, 2)
    p.add_argument(
        "--quick", action="store_true", help=f"{QUICK_STEPS} steps per job: about a minute"
    )
    common.add_job_flags(p, _TRAIN_FIELDS, TRAIN_DEFAULTS, "one job")


def plan(args: argparse.Namespace) -> StragglerPlan:
    train = config_from_args(args, [*_TRAIN_FIELDS, "collective_timeout_s"], TRAIN_DEFAULTS)
    slowdown = args.slowdown
    if slowdown is None:
        slowdown = 1.0 if args.slow_link_ms else 4.0
    if args.quick:
        train = train.replace(steps=QUICK_STEPS)
    return StragglerPlan(
        rank=args.rank,
        slowdown=slowdown,
        cpus=args.cpus,
        slow_link_ms=args.slow_link_ms,
        shaper=args.shaper,
        nodes=args.nodes,
        warmup=args.warmup,
        train=train,
        **common.run_fields(args),
        impair=common.impairments(args),
    )


def report(result: StragglerResult) -> int:
    """Exit 0 when both jobs finished with parity, else 1."""
    return report_sweep(
        result, analyse, files=write_files, console=closing, page=page.page, name=NAME
    )
