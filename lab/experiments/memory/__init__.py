"""``python -m lab memory``: sharding the optimizer state (ZeRO stage 1) divides the state every
rank holds and moves the bytes DDP moves; whether that lets a job fit where DDP with Adam is
killed for memory is what the limited jobs measure.

The same job runs three ways, each in fresh containers, one rank each: our DDP with Adam, ours
with the optimizer state sharded (each rank keeps Adam's moments for its shard only), and
torch's DDP with torch's ``ZeroRedundancyOptimizer``. Per rank: the peak memory (the process's
RSS, the container's high-water mark), the optimizer state's bytes, the bytes on the link per
step and the step time. Then, under a container memory limit between the sharded run's peak and
DDP's, both run again: DDP with Adam should be killed by the kernel for memory (the engine's
oom event names it) and the sharded run finish with parity against the single process.
"""

from __future__ import annotations

import argparse
import textwrap

from ddp.torchfree import config_from_args
from lab import args as common
from lab.experiments.memory import page
from lab.experiments.memory.analysis import DEFINITIONS, analyse
from lab.experiments.memory.outputs import write_files
from lab.experiments.memory.plan import QUICK_STEPS, TRAIN_DEFAULTS, MemoryPlan
from lab.experiments.memory.result import MemoryResult
from lab.experiments.memory.run import run as run  # the package's run(): see lab.experiments
from lab.experiments.memory.text import closing
from lab.experiments.reporting import report_sweep

NAME = "memory"
HELP = "shard Adam's state (ZeRO-1): its memory per rank, its link bytes, the limit it fits in"
DESCRIPTION = textwrap.fill(
    "The same job three ways, each in fresh containers with one rank each: our DDP with Adam, "
    "ours with the optimizer state sharded, and torch's DDP with torch's "
    "ZeroRedundancyOptimizer. Adam keeps two tensors per parameter, twice the model, and with "
    "DDP every rank keeps all of them; sharded, each rank keeps its 1/N, while the gradients' "
    "reduce-scatter and the parameters' all-gather move what one allreduce moves. Then under a "
    "container memory limit chosen between the two runs' peaks: DDP with Adam is killed for "
    "memory, the sharded run finishes with parity.",
    width=92,
)
EPILOG = "\n".join(
    [
        "The table gives, per job and rank:",
        *common.definitions(DEFINITIONS),
        "The memory limit is chosen per node, halfway from the sharded run's",
        "peak to DDP's on that node, no swap; --limit-mb sets one limit instead. Node 0 runs",
        "unlimited: it also trains the parity reference and gathers the whole optimizer state",
        "for it before every step, so it holds the whole state sharded or not.",
        "The closing line is",
        "  sharded optimizer at N ranks: optimizer state X.XXx per rank (torch ZeRO: ...), link",
        "  bytes X.XXx DDP (torch ZeRO: ...), step time X.XXx DDP (torch ZeRO: ...); fits in",
        "  M MiB where DDP+Adam was killed",
        "Files in runs/<run-id>/: memory.csv, memory.txt, memory.json, report.html and one",
        "folder per job with logs/rank<R>.jsonl and node<N>.log.",
        "Exit codes: 0 parity held everywhere, DDP+Adam was killed for memory under the limit",
        "and the sharded run fit; 1 otherwise; 2 bad arguments; 130 interrupted.",
    ]
)

_TRAIN_FIELDS = ["model", "steps", "batch_size", "lr", "seed", "bucket_cap_mb"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_nodes(p, 4)
    common.add_warmup(p, 1)
    p.add_argument(
        "--limit-mb",
        type=common.number(0, strict=True),
        metavar="MB",
        help="one memory limit (MiB) on every node for the limited jobs, instead of the one "
        "chosen from the measured peaks",
    )
    p.add_argument(
        "--no-limit",
        dest="limit",
        action="store_false",
        help="measure only: skip the jobs under a memory limit",
    )
    p.add_argument(
        "--quick", action="store_true", help=f"{QUICK_STEPS} steps per job: a few minutes"
    )
    common.add_job_flags(p, _TRAIN_FIELDS, TRAIN_DEFAULTS, "one job")


def plan(args: argparse.Namespace) -> MemoryPlan:
    train = config_from_args(args, [*_TRAIN_FIELDS, "collective_timeout_s"], TRAIN_DEFAULTS)
    if args.quick:
        train = train.replace(steps=QUICK_STEPS)
    return MemoryPlan(
        nodes=args.nodes,
        warmup=args.warmup,
        train=train,
        limit=args.limit,
        limit_mib=args.limit_mb,
        **common.run_fields(args),
    )


def report(result: MemoryResult) -> int:
    """Exit 0 when parity held everywhere and the limit killed DDP+Adam but not the sharded
    run, else 1."""
    return report_sweep(
        result, analyse, files=write_files, console=closing, page=page.page, name=NAME
    )
