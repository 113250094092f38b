"""``python -m lab run [layout] [link] [faults] -- SCRIPT [ARGS...]``: the user's own torch DDP
script across the lab's nodes, on a verified link and under faults, explained when it hangs.

This file is the command: its flags and the plan made from them. The experiment is
:mod:`.run`, read top to bottom: plan -> run (the faults fired on cue) -> result -> analysis
(one summary) -> ``report.json``, ``steps.png``, the scalars, the page and the console's lines,
each from that summary. Beside it, one idea each: the faults as the user writes them
(:mod:`.faults`), the job's workers seen from outside (:mod:`.workers`), and when the steps
stop and what the stuck job says about itself (:mod:`.hang`). ``--recovery live`` (a script
whose loop uses ``ddp.recovery.api.Manager``) is :mod:`.live`: one replica per node on the
lab's etcd, a kill survived, a replacement healed.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from lab.args import add_common, add_impairments, add_shaper, number
from lab.experiments.run import live
from lab.experiments.run import run as torchrun
from lab.experiments.run.faults import parse_fault
from lab.experiments.run.run import MAX_WORKDIR_MB, RECOVERIES, RunPlan, RunResult, resolve
from lab.shaping.impair import Impairments

__all__ = ["add_arguments", "plan", "report", "run"]

NAME = "run"
HELP = "your own torch DDP script across the nodes, on a shaped link, under faults, explained"
DESCRIPTION = (
    "Run any torch DDP script (everything after --) under torchrun on every node, its folder "
    "(--workdir) copied into each; the link between the nodes shaped and verified by the "
    "probe; faults on cue. The image makes every DistributedDataParallel the script builds "
    "report its steps, so the lab shows progress, fires step cues, and when the steps stop "
    "it reads every rank's flight recorder and Python stack and says in one line who is "
    "missing where. The script is not changed."
)
EPILOG = f"""\
examples:
  python -m lab run --nodes 2 --ranks-per-node 2 --ms 5 -- python examples/ddp_minimal.py
  python -m lab run --nodes 2 --ranks-per-node 2 --fault kill:rank=2:at-step=10 -- python train.py
  python -m lab run --nodes 2 --fault link:ms=50:at-step=40 -- train.py --epochs 3
  python -m lab run --recovery live --nodes 3 --fault kill:rank=1:at-step=6:rejoin \\
      -- python examples/recovery_loop.py --steps 40
faults (--fault, several allowed): kill:rank=R:at-step=N (SIGKILL of rank R's worker in step
N), pause:node=K:at=20s[:for=10s] (docker pause), partition:node=K:at-step=N[:for=S]
(iptables DROP), link:ms=MS[:rate-mbit=R]:at-step=N (the link changes, verified again).
at-step needs the step records; at=SECONDS (from the job's start) works without.
--recovery live (the script's loop uses ddp.recovery.api.Manager): one replica per node
(RANK=node), the job's etcd on 3 more nodes and the decider on one; the Manager writes its
records to the lab by itself (DDP_LOG_DIR). kill:rank=R:at-step=N docker-kills replica R's
container once R committed step N - 1; :rejoin then starts a replacement with the same RANK
in it, which heals from a peer. Refused with it: --ranks-per-node other than 1, --nodes
below 3, a shaped link, --hang-after, faults other than one kill. The report shows every
quorum, fault and heal on a timeline and judges from the commit records: every step
committed once by every survivor (and the replacement), every replica's exit 0.
prints: the nodes' output, progress, the faults as they land, then
  run: 4 ranks on 2 nodes, 5 ms between nodes; 120 steps, median 84.2 ms (p90 91.0); ...
  and, when the job hung or failed, a last line `diagnosis: ...`.
files: runs/<run-id>/report.html, report.json, steps.png, summary.json, tb/, job/logs/.
refused (exit 2): a script not in --workdir, a workdir over {MAX_WORKDIR_MB:g} MB, a
requirements file that does not resolve, a fault aimed outside the layout.
Exit codes: 0 the job ended cleanly (replicas identical where digests came), 1 it did not
(or a diagnosis), 2 bad arguments, 130 interrupted."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("layout")
    g.add_argument("--nodes", type=number(1, kind=int), default=2, help="containers (default 2)")
    g.add_argument(
        "--ranks-per-node",
        type=number(1, kind=int),
        default=1,
        help="torchrun workers per node (its --nproc-per-node; default 1; --recovery live: 1)",
    )
    g.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="the folder copied into every node, the command's cwd (default: the current one)",
    )
    g.add_argument(
        "--requirements",
        type=Path,
        metavar="FILE",
        help="extra packages (pip's requirements format), built into a derived image offline",
    )
    link = p.add_argument_group("the link between the nodes (verified by the probe)")
    link.add_argument(
        "--ms", type=number(0), default=0.0, help="one-way delay per packet (default 0: unshaped)"
    )
    link.add_argument(
        "--rate-mbit", type=number(0, strict=True), help="rate cap in Mbit/s (default none)"
    )
    add_shaper(link)
    add_impairments(p)
    g.add_argument(
        "--recovery",
        choices=RECOVERIES,
        default="torchrun",
        help="torchrun: under torchrun, a lost rank ends the job (default); live: the script's "
        "ddp.recovery.api.Manager goes on without it, one replica per node on the lab's etcd",
    )
    f = p.add_argument_group("faults and hangs")
    f.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="kill:rank=R:at-step=N, pause:node=K:at=20s:for=10s, partition:node=K:at-step=N, "
        "link:ms=MS:at-step=N (several allowed; default none)",
    )
    f.add_argument(
        "--hang-after",
        type=number(0, strict=True),
        metavar="S",
        help="no step record for S seconds means stuck (default 5 median steps, at least 10 s)",
    )
    f.add_argument(
        "--no-instrument",
        dest="instrument",
        action="store_false",
        help="run the script without the DDP instrumentation (no steps, no flight recorder)",
    )
    f.add_argument(
        "--run-timeout",
        type=number(0, strict=True),
        default=600.0,
        metavar="S",
        help="seconds the job may take before it is stopped (default 600)",
    )
    add_common(p)
    p.add_argument(
        "user_command", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="what to run"
    )


def plan(args: argparse.Namespace) -> RunPlan:
    command = list(args.user_command)
    if command and command[0] == "--":
        command = command[1:]
    made = RunPlan(
        tuple(command),
        workdir=args.workdir if args.workdir is not None else Path.cwd(),
        nodes=args.nodes,
        ranks_per_node=args.ranks_per_node,
        ms=args.ms,
        rate_mbit=args.rate_mbit,
        impair=Impairments(args.jitter_ms, args.jitter_distribution, args.loss_pct),
        shaper=args.shaper,
        faults=tuple(parse_fault(text) for text in args.fault),
        hang_after_s=args.hang_after,
        requirements=args.requirements,
        instrument=args.instrument,
        run_timeout_s=args.run_timeout,
        image=args.image,
        runs_dir=args.runs_dir,
        progress=args.progress,
        recovery=args.recovery,
    )
    resolve(made)  # pip on the host: a requirements file that does not resolve is refused here
    return made


def run(plan: RunPlan, echo: Callable[[str], None] = print) -> RunResult | live.LiveRunResult:
    """The plan's path: under torchrun (:mod:`.run`) or with live recovery (:mod:`.live`)."""
    return live.run(plan, echo) if plan.live else torchrun.run(plan, echo)


def report(result: RunResult | live.LiveRunResult) -> int:
    if isinstance(result, live.LiveRunResult):
        return live.report(result)
    return torchrun.report(result)
