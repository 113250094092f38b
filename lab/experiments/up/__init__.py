"""``python -m lab up``: run a topology to its parity verdict and leave nothing behind."""

from __future__ import annotations

import argparse
from pathlib import Path

from ddp.torchfree import add_train_arguments, config_from_args
from lab import args as common
from lab.engine.layout import Layout
from lab.experiments.up import page
from lab.experiments.up.analysis import analyse
from lab.experiments.up.outputs import write_files
from lab.experiments.up.plan import LAUNCHERS, TOPOLOGIES, Topology, UpPlan, load_topology
from lab.experiments.up.result import UpResult
from lab.experiments.up.run import run as run  # the package's run(): see lab.experiments
from lab.experiments.up.text import format_summary
from lab.report.publish import publish

NAME = "up"
HELP = "run a topology to its parity verdict, then remove it"
DESCRIPTION = (
    "Start one container per node on a private network with a shared volume, run "
    "`python -m ddp train` on every rank, follow their records (progress bar, per-rank lines), "
    "collect the logs into runs/<run-id>/ and re-judge parity from them. Everything the run "
    "created is removed afterwards, also on errors and Ctrl-C."
)
EPILOG = f"""\
Topology files: {TOPOLOGIES.relative_to(TOPOLOGIES.parents[3])}/*.yaml (nodes, ranks_per_node,
train: any `python -m ddp train` setting); flags override the file.
Files: runs/<run-id>/report.html, summary.json, topology.yaml, tb/train/ (TensorBoard),
train/logs/rank<R>.jsonl, train/node<N>.log.
Exit codes: 0 parity holds and every rank exited 0, 1 parity broken or a rank failed,
2 bad arguments, 130 interrupted."""

_TRAIN_FIELDS: list[str] = []


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", type=Path, help="a topology YAML file (default: 4 nodes x 1)")
    p.add_argument("--nodes", type=common.number(1, kind=int), help="containers (default 4)")
    p.add_argument(
        "--ranks-per-node", type=common.number(1, kind=int), help="ranks per container (default 1)"
    )
    common.add_procs_per_node(
        p, "the same as --ranks-per-node, in torchrun's words (its --nproc-per-node)"
    )
    p.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        default="file",
        help="file: lab starts every rank with its --rank on a file:// rendezvous on the shared "
        "volume; torchrun: one torchrun per node, ranks assigned by its c10d rendezvous on "
        "node 0 (default %(default)s)",
    )
    _TRAIN_FIELDS[:] = add_train_arguments(p, ("train",), keep_unset=True)
    common.add_collective_timeout(p, 300.0, keep_unset=True)
    common.add_run_timeout(p, 600.0, "the whole run")
    common.add_common(p)


def plan(args: argparse.Namespace) -> UpPlan:
    base = load_topology(args.topology) if args.topology else Topology()
    per_node = args.ranks_per_node
    if args.procs_per_node is not None:
        if per_node is not None and per_node != args.procs_per_node:
            raise ValueError("--ranks-per-node and --procs-per-node differ: pass one of them")
        per_node = args.procs_per_node
    layout = Layout(
        args.nodes if args.nodes is not None else base.layout.nodes,
        per_node if per_node is not None else base.layout.ranks_per_node,
    )
    train = config_from_args(args, [*_TRAIN_FIELDS, "collective_timeout_s"], base.train)
    same_layout = layout == base.layout
    return UpPlan(
        layout,
        train,
        base.name if same_layout else "",
        args.image,
        args.run_timeout,
        args.runs_dir,
        args.progress,
        args.launcher,
    )


def report(result: UpResult) -> int:
    summary = analyse(result)
    write_files(summary)
    made = page.page(summary)  # its summary's common fields merge into summary.json
    for line in publish(result.run_dir, made.page, made.summary, made.files, made.jobs):
        print(line)
    print(format_summary(summary))
    return 0 if summary.ok else 1
