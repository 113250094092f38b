"""``python -m lab topology``: ranks on several nodes, a slow link between the nodes and
loopback within; torch's DDP as its users run it against ours, and the limit beside them.

One cluster per layout (``--layouts 2x2,4x2``, or ``--nodes`` x ``--ranks-per-node``), ranks of
a node in one container; every container's eth0 delayed (and optionally capped), verified by
the probe, which is exactly the link between nodes since ranks of one node talk over loopback.
The configurations train the same job in interleaved rounds, steps pooled: the limit (torch's
DDP on the bare link, the link cleared for it and shaped again after), torch's DDP at its
defaults, ours on gloo's flat ring, ours with the hierarchical hook (fp32, and fp16 on the
cross-node leg), ours with ``comm auto``. With ``--change-at-step`` the link changes during
every job but the limit's.
"""

from __future__ import annotations

import argparse
import textwrap

from ddp.torchfree import config_from_args
from lab import args as common
from lab.engine.layout import Layout
from lab.experiments.link_change import ChangePlan, add_change_flags
from lab.experiments.reporting import report_sweep
from lab.experiments.topology import page
from lab.experiments.topology.analysis import DEFINITIONS, analyse
from lab.experiments.topology.outputs import write_files
from lab.experiments.topology.plan import (
    LESSONS,
    QUICK,
    TRAIN_DEFAULTS,
    TopologyPlan,
    parse_layouts,
)
from lab.experiments.topology.result import TopologyResult
from lab.experiments.topology.run import run as run  # the package's run(): see lab.experiments
from lab.experiments.topology.text import closing

NAME = "topology"
HELP = "nodes x ranks with a slow link between nodes: flat ring vs a two-level allreduce"
DESCRIPTION = textwrap.fill(
    "Delays the link between nodes (not within one: ranks of a node share its container and "
    "talk over loopback), verifies it, then trains the same job in each layout: the limit "
    "(torch's DDP on the bare link, the shaping cleared for it), torch's DDP as shipped (25 MB "
    "cap, gloo's flat ring), ours on the flat ring, ours with the hierarchical hook (reduce "
    "within the node, allreduce across the node leaders, broadcast within), the same with fp16 "
    "on the cross-node leg, and ours with comm auto (bucket cap and algorithm chosen together "
    "from what it measured). A flat ring over N ranks waits 2(N-1) times on the slow link per "
    "allreduce; across M node leaders it waits 2(M-1) times. Reports per row the median step "
    "time, its network cost (minus the limit's), the bytes that crossed the link per step "
    "(measured on every node's eth0), the ratio to torch's DDP and ddp's parity verdict.",
    width=92,
)


EPILOG = "\n".join(
    [
        "The reference is torch's DDP as its users run it: every row but comm auto at",
        "--bucket-cap-mb 25, one bucket of the deep MLP's 2.67 MB. --lesson per-tensor runs",
        "every row at cap 0 instead (one allreduce per tensor: 24 latency-bound allreduces per",
        "step, where a two-level allreduce pays most). Every rank of every layout shares this",
        "host's cores, so compute per step grows with the ranks: the limit row shows how much.",
        "The table's figures:",
        *common.definitions(DEFINITIONS),
        "The last lines, one per layout, for scripts:",
        "  step time vs torch DDP (2 nodes x 2 ranks, 5 ms): comm auto R, hierarchical R,",
        "  hierarchical-fp16 R, flat R; vs the limit: torch DDP R, comm auto R, ...",
        "  (R: median step time / torch DDP's or the limit's, e.g. 0.45x; < 1 is faster)",
        "Files in runs/<run-id>/: topology.txt (the tables), topology.csv, topology.json,",
        "topology.png (step time per configuration and layout), and per job",
        "<layout>-<configuration>-r<round>/ with logs/rank<R>.jsonl, node<N>.log and",
        "eth0-node<N>.txt (the sampled byte counters).",
        "Exit codes: 0 every job finished with parity holding, 1 a job failed or parity broke,",
        "2 bad arguments, 130 interrupted.",
    ]
)

_TRAIN_FIELDS = ["model", "steps", "batch_size", "bucket_cap_mb", "seed"]
_QUICK = f"--quick {QUICK['rounds']}"


def add_arguments(p: argparse.ArgumentParser) -> None:
    link = p.add_argument_group("the link between nodes (verified by the probe before training)")
    link.add_argument(
        "--ms",
        type=common.number(0),
        default=5.0,
        help="one-way delay in ms; none within a node (default %(default)g)",
    )
    link.add_argument(
        "--rate-mbit",
        type=common.number(0, strict=True),
        metavar="R",
        help="also cap each node's link at R Mbit/s (default: no cap)",
    )
    common.add_shaper(link)
    layout = p.add_argument_group("the layouts and the measurement")
    layout.add_argument(
        "--layouts",
        metavar="NxR,...",
        help="several layouts in one command, e.g. 2x2,4x2,2x4,8x1: N nodes x R ranks each, "
        "one cluster and one table each (default: --nodes x --ranks-per-node)",
    )
    common.add_nodes(layout, None, shown=2, what="containers")
    layout.add_argument(
        "--ranks-per-node",
        type=common.number(1, kind=int),
        help="ranks in each container, on its loopback (default 2; with 1 the two-level rows "
        "would be the flat ring and are left out)",
    )
    common.add_warmup(
        layout,
        TopologyPlan.warmup,
        " and the bytes: gloo's set-up, the bucket rebuild, comm auto's measurements",
    )
    common.add_rounds(
        layout,
        "every configuration this often, interleaved, steps pooled "
        f"(default {TopologyPlan.rounds}; {_QUICK})",
    )
    layout.add_argument(
        "--quick",
        action="store_true",
        help=f"a few minutes: {QUICK['rounds']} round of {QUICK['steps']} steps "
        "(where --rounds and --steps are not given)",
    )
    layout.add_argument(
        "--caps",
        type=common.float_list,
        default=(),
        help="also run ours flat at these bucket caps (MB, comma-separated) and the auto "
        "bucket cap alone, judged against them (default: none)",
    )
    layout.add_argument(
        "--lesson",
        choices=tuple(LESSONS),
        help="a lesson variant: per-tensor runs every row at --bucket-cap-mb 0, one "
        "allreduce per tensor (default: none, torch's defaults)",
    )
    add_change_flags(p, "every node's link (the limit's stays bare)")
    common.add_job_flags(p, _TRAIN_FIELDS, TRAIN_DEFAULTS, "one job")


def _layouts(args: argparse.Namespace) -> tuple[Layout, ...]:
    if args.layouts is not None:
        if args.nodes is not None or args.ranks_per_node is not None:
            raise ValueError("give --layouts or --nodes/--ranks-per-node, not both")
        return parse_layouts(args.layouts)
    return (Layout(args.nodes or 2, 2 if args.ranks_per_node is None else args.ranks_per_node),)


def plan(args: argparse.Namespace) -> TopologyPlan:
    train = config_from_args(args, [*_TRAIN_FIELDS, "collective_timeout_s"], TRAIN_DEFAULTS)
    quick = QUICK if args.quick else {}
    if train.steps == TRAIN_DEFAULTS.steps:
        train = train.replace(steps=quick.get("steps", train.steps))
    if args.lesson and train.bucket_cap_mb == TRAIN_DEFAULTS.bucket_cap_mb:
        train = train.replace(bucket_cap_mb=LESSONS[args.lesson])
    return TopologyPlan(
        layouts=_layouts(args),
        ms=args.ms,
        rate_mbit=args.rate_mbit,
        shaper=args.shaper,
        warmup=args.warmup,
        rounds=args.rounds or quick.get("rounds", TopologyPlan.rounds),
        train=train,
        **common.run_fields(args),
        quick=args.quick,
        caps=tuple(args.caps),
        lesson=args.lesson or "",
        change=ChangePlan.from_args(args),
    )


def report(result: TopologyResult) -> int:
    """Exit 0 when every job finished with parity holding, else 1."""
    return report_sweep(
        result, analyse, files=write_files, console=closing, page=page.page, name=NAME
    )
