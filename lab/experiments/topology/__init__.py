"""``python -m lab topology``: ranks on several nodes, a slow link between the nodes and
loopback within, and what a two-level allreduce does about it.

One cluster of ``--nodes`` containers, ``--ranks-per-node`` ranks in each; every container's
eth0 delayed (and optionally capped), verified by the probe, which is exactly the link between
nodes since ranks of one node talk over loopback. Then five configurations train the same job:
torch's DDP and ours on gloo's flat ring, ours with the hierarchical hook (fp32, and fp16 on the
cross-node leg), ours with the auto bucket cap; in interleaved rounds, steps pooled.
"""

from __future__ import annotations

import argparse
import textwrap

from ddp.torchfree import config_from_args
from lab import args as common
from lab.experiments.reporting import report_sweep
from lab.experiments.topology import page
from lab.experiments.topology.analysis import DEFINITIONS, analyse
from lab.experiments.topology.outputs import write_files
from lab.experiments.topology.plan import QUICK, TRAIN_DEFAULTS, TopologyPlan
from lab.experiments.topology.result import TopologyResult
from lab.experiments.topology.run import run as run  # the package's run(): see lab.experiments
from lab.experiments.topology.text import closing

NAME = "topology"
HELP = "nodes x ranks with a slow link between nodes: flat ring vs a two-level allreduce"
DESCRIPTION = textwrap.fill(
    "Delays the link between nodes (not within one: ranks of a node share its container and "
    "talk over loopback), verifies it, then trains the same job five ways: torch's DDP and ours "
    "on gloo's flat ring, ours with the hierarchical hook (reduce within the node, allreduce "
    "across the node leaders, broadcast within), the same with fp16 on the cross-node leg, "
    "and ours with the auto bucket cap. A flat ring over N ranks waits 2(N-1) times on the "
    "slow link per allreduce; across M node leaders it waits 2(M-1) times. Reports the median "
    "step time, the bytes that crossed the link per step (measured on every node's eth0), the "
    "speedup vs torch's DDP and ddp's parity verdict.",
    width=92,
)


EPILOG = "\n".join(
    [
        "The default workload lets the slow link set the step time: the deep MLP (24 tensors,",
        "2.67 MB, a few ms of compute per rank) with one bucket per tensor (--bucket-cap-mb 0,",
        "every configuration but auto), so 24 latency-bound allreduces per step; its 256 KB",
        "weights make bytes count once --rate-mbit caps the link.",
        "The table's figures:",
        *common.definitions(DEFINITIONS),
        "The last line, for scripts:",
        "  step time vs torch DDP (2 nodes x 2 ranks, 5 ms): hierarchical R,",
        "  hierarchical-fp16 R, auto cap R, flat R",
        "  (R: median step time / torch DDP's, e.g. 0.45x; < 1 is faster)",
        "Files in runs/<run-id>/: topology.txt (the table), topology.csv, topology.json,",
        "topology.png (step time per configuration), and per job",
        "<configuration>-r<round>/ with logs/rank<R>.jsonl, node<N>.log and eth0-node<N>.txt",
        "(the sampled byte counters).",
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
    layout = p.add_argument_group("the layout and the measurement")
    common.add_nodes(layout, 2, what="containers")
    layout.add_argument(
        "--ranks-per-node",
        type=common.number(2, kind=int),
        default=2,
        help="ranks in each container, on its loopback (default %(default)s)",
    )
    common.add_warmup(
        layout,
        TopologyPlan.warmup,
        " and the bytes: gloo's set-up, the bucket rebuild, the auto cap's measurements",
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
        help="also run ours flat at these bucket caps (MB, comma-separated): a sweep that the "
        "auto cap's choice is judged against (default: none)",
    )
    common.add_job_flags(p, _TRAIN_FIELDS, TRAIN_DEFAULTS, "one job")


def plan(args: argparse.Namespace) -> TopologyPlan:
    train = config_from_args(args, [*_TRAIN_FIELDS, "collective_timeout_s"], TRAIN_DEFAULTS)
    quick = QUICK if args.quick else {}
    if train.steps == TRAIN_DEFAULTS.steps:
        train = train.replace(steps=quick.get("steps", train.steps))
    return TopologyPlan(
        nodes=args.nodes,
        ranks_per_node=args.ranks_per_node,
        ms=args.ms,
        rate_mbit=args.rate_mbit,
        shaper=args.shaper,
        warmup=args.warmup,
        rounds=args.rounds or quick.get("rounds", TopologyPlan.rounds),
        train=train,
        **common.run_fields(args),
        quick=args.quick,
        caps=tuple(args.caps),
    )


def report(result: TopologyResult) -> int:
    """Exit 0 when every job finished with parity holding, else 1."""
    return report_sweep(
        result, analyse, files=write_files, console=closing, page=page.page, name=NAME
    )
