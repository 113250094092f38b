"""``python -m lab kill``: hit one rank of a run mid-step, report who noticed what, recover.

Three paths, one module each, read top to bottom from the plan to the report:
:mod:`.restart` (the survivors exit with a diagnosis; ``--recover`` restarts every rank from
a checkpoint), :mod:`.torchrun` (``--launcher torchrun``: the agent restarts the worker group)
and :mod:`.live` (``--recovery live|torchft``: the survivors go on in a new quorum); what they
share is :mod:`.shared`. This module parses the flags, fills in the chosen path's defaults
where a flag was not given, and hands the plan to that path."""

from __future__ import annotations

import argparse
import dataclasses
import re
from typing import Any

from ddp.torchfree import TrainConfig, add_train_arguments, flag_of
from lab import args as common
from lab.engine.placement import current
from lab.experiments.kill import live, restart, torchrun
from lab.experiments.kill.live import (
    COORDINATOR_LOST,
    ETCD_MEMBERS,
    LIVE_TRAIN,
    TARGETS,
    LivePlan,
    LiveResult,
)
from lab.experiments.kill.restart import DEFAULT_TRAIN, RUN_TIMEOUT_HELP, KillPlan, KillResult
from lab.experiments.kill.torchrun import TorchrunKillPlan, TorchrunKillResult
from lab.experiments.up import LAUNCHERS
from lab.faults import FAULTS
from lab.hostflags import add_host_target, host_rank

__all__ = ["DESCRIPTION", "EPILOG", "HELP", "NAME", "add_arguments", "plan", "report", "run"]

NAME = "kill"
HELP = "kill, pause or cut off one rank mid-run; diagnose; optionally recover"
DESCRIPTION = (
    "Inject a fault into one rank of a run (one rank per container) during a chosen step: "
    "lab follows the ranks' records and hits the target as soon as it reports the step "
    "before. The survivors notice, dump their flight recorders and exit with ddp's diagnosis; "
    "lab prints a timeline, a per-rank table and whether the diagnosis names the rank it hit. "
    "With --recover an uninterrupted run comes first and every rank resumes from the newest "
    "checkpoint after the fault. With --launcher torchrun one worker process is SIGKILLed "
    "instead, torchrun's agent restarts the worker group, the workers resume from the newest "
    "checkpoint by themselves, and lab prints the timeline and compares the final parameters "
    "with an uninterrupted run's. Everything the run created is removed afterwards, also on "
    "errors and Ctrl-C."
)
_MODES = "\n".join(f"  {name:<10} {fault.HELP}" for name, fault in FAULTS.items())
EPILOG = f"""\
Modes:
{_MODES}
The last line names the missing rank, e.g.
  diagnosis: rank 2 missing at step 5 (allreduce of bucket 0, seq 10); ranks 0,1,3
    noticed after 30.0 s
With --recover it is followed by
  recovered: final parameters bitwise identical to an uninterrupted run
With --launcher torchrun (--mode kill or host, no --recover):
  python -m lab kill --launcher torchrun --mode kill --nodes 2 --procs-per-node 2 \
    --max-restarts 1 --rank 3 --at-step 5
prints the restart timeline (fault, the agent's report, the restarted workers, the step they
resumed after, the verdict, torchrun's exits), the checks, and ends with e.g.
  recovered: final parameters of all 4 ranks bitwise identical to an uninterrupted run ...
Across hosts, --mode host takes host K away under torchrun (--nnodes MIN:MAX, MIN the nodes
left; the survivors start fresh, as hosts share no volume):
  python -m lab kill --launcher torchrun --mode host --host 2 --at-step 5 --nodes 3 \
    --checkpoint-every 0 --batch-size 48 --hosts HOSTS
Files: runs/<run-id>/report.json, <phase>/logs/rank<R>.jsonl, fault/logs/flight/
flight_rank<R>.json, <phase>/node<N>.log (phases: reference, fault, resume; under torchrun
reference and fault, and a restarted rank's next attempt in rank<R>.attempt<N>.jsonl).
Exit codes: 0 the diagnosis names the rank that was hit (and the recovery is bitwise
identical; under torchrun: the workers were restarted, resumed from a checkpoint and ended
bitwise identical), 1 otherwise or a phase failed, 2 bad arguments, 130 interrupted."""

# The training each path runs where a flag was not given: the help says these, and the plans
# start from them. The restart path's and torchrun's (the mini model, a 250 ms sleep per step
# so the fault lands inside its step) differ from the live paths' (the tower model, whose
# healing moves real bytes, and a 10 s collective timeout that the quorum outlives).
TRAIN_DEFAULTS = {"restart": DEFAULT_TRAIN, "torchrun": DEFAULT_TRAIN, "live": LIVE_TRAIN}
_LIVE_NOTE = "--recovery live or torchft"

_TRAIN_FIELDS: list[str] = []
# Of the "fault" group, what a user sets here; lab sets the checkpoint directory and --resume
# per phase.
_FAULT_FIELDS = ("checkpoint_every", "step_delay_ms")


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def default_text(name: str) -> str:
    """``(default 12; --recovery live or torchft: 40)``: the default of field ``name`` on each
    path, from :data:`TRAIN_DEFAULTS`."""
    ours, theirs = getattr(DEFAULT_TRAIN, name), getattr(LIVE_TRAIN, name)
    if ours == theirs:
        return f"(default {_shown(ours)})"
    return f"(default {_shown(ours)}; {_LIVE_NOTE}: {_shown(theirs)})"


def _per_path_help(p: argparse.ArgumentParser, names: list[str]) -> None:
    """Every training flag's help says each path's default (the flags are left unset, so
    "not given" is told apart from a value equal to one path's default)."""
    for action in p._actions:
        if action.dest in names and action.help:
            action.help = re.sub(r" \(default [^)]*\)$", "", action.help)
            action.help += " " + default_text(action.dest)


def _add_fields(p: argparse.ArgumentParser, names: tuple[str, ...]) -> None:
    """Flags of single TrainConfig fields, their help and metavar from the field's metadata."""
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    group = p.add_argument_group("faults and recovery")
    for name in names:
        f = fields[name]
        group.add_argument(
            flag_of(name),
            dest=name,
            type=type(f.default),
            default=argparse.SUPPRESS,
            metavar=f.metadata.get("metavar"),
            help=f"{f.metadata['help']} {default_text(name)}",
        )


def _given(args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    """The training fields given on the command line (the others are not in ``args``)."""
    return {n: getattr(args, n) for n in names if hasattr(args, n)}


def _renamed(text: str) -> None:
    raise argparse.ArgumentTypeError(
        "was renamed: --collective-timeout S is how long a rank waits for its peers, "
        "--run-timeout S bounds a phase"
    )


def _add_live_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("live recovery (--recovery live: no restart, no checkpoint)")
    g.add_argument(
        "--recovery",
        choices=("restart", "live", "torchft"),
        default="restart",
        help="restart: the survivors exit with a diagnosis (with --recover every rank restarts "
        "from a checkpoint); live: they go on in a new quorum within seconds, and the run is "
        "compared with the restart path on the same job (default restart)",
    )
    g.add_argument(
        "--rejoin",
        action="store_true",
        help="--recovery live: start a replacement for the lost rank once the "
        "survivors committed a step without it; it heals from a peer",
    )
    g.add_argument(
        "--target",
        choices=TARGETS,
        default=None,
        help="--recovery live: what the fault hits: rank (the --rank given), coordinator "
        "(the launcher's decider's container: a member takes the role and training goes on), "
        "or etcd (--count of the job's 3 etcd members' containers: one lost is survived; two "
        f"are a majority, and every rank stops with exit {COORDINATOR_LOST}); no other path "
        "runs beside the last two (default rank)",
    )
    g.add_argument(
        "--count",
        type=common.number(1, kind=int),
        default=None,
        help=f"--target etcd: how many of its {ETCD_MEMBERS} members to hit (1 unless given)",
    )
    g.add_argument(
        "--heartbeat-timeout",
        type=common.number(0, strict=True),
        metavar="S",
        help="--recovery live: a rank whose heartbeats stop this long leaves the "
        f"quorum (default {LIVE_TRAIN.heartbeat_timeout_s:g})",
    )
    g.add_argument(
        "--no-compare",
        action="store_true",
        help="--recovery live: skip the restart path's run on the same job",
    )
    g.add_argument(
        "--compare",
        metavar="LIST",
        default=None,
        help="--recovery live|torchft: the other paths to run on the same job, comma-separated: "
        "restart, torchft (default restart; torchft needs an image built with "
        "`python -m lab image --extras torchft`)",
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rank",
        type=common.number(0, kind=int),
        help="the rank to hit (one rank per node, so also its node; under torchrun, its "
        "worker process, wherever the rendezvous placed it)",
    )
    add_host_target(p)
    p.add_argument(
        "--at-step",
        type=common.number(1, kind=int),
        required=True,
        help="the step (1-based) during which the fault lands",
    )
    p.add_argument(
        "--mode",
        required=True,
        choices=tuple(FAULTS),
        help="how to hit it: " + ", ".join(FAULTS) + " (see below)",
    )
    p.add_argument(
        "--recover",
        action="store_true",
        help="resume from the last checkpoint and compare bitwise with an uninterrupted run",
    )
    _add_live_arguments(p)
    common.add_nodes(p, 4, "; under torchrun --procs-per-node each")
    p.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        default="file",
        help="file: lab starts every rank and hits its container; torchrun: one torchrun per "
        "node, a worker process is killed and torchrun restarts the group (default %(default)s)",
    )
    common.add_procs_per_node(
        p, "--launcher torchrun: workers per node (torchrun's --nproc-per-node; default 1)"
    )
    p.add_argument(
        "--max-restarts",
        type=common.number(0, kind=int),
        help="--launcher torchrun: restarts of the worker group torchrun allows (default 1)",
    )
    _TRAIN_FIELDS[:] = add_train_arguments(p, ("train",), defaults=DEFAULT_TRAIN, keep_unset=True)
    _add_fields(p, _FAULT_FIELDS)
    common.add_collective_timeout(p, DEFAULT_TRAIN.collective_timeout_s, keep_unset=True)
    _per_path_help(p, [*_TRAIN_FIELDS, "collective_timeout_s"])
    common.add_run_timeout(
        p,
        None,
        "an undisturbed phase (and the fault phase up to the injection)",
        derived=RUN_TIMEOUT_HELP,
    )
    common.add_common(p)
    p.add_argument("--timeout", type=_renamed, help=argparse.SUPPRESS)  # the old flag, explained


def _live_plan(args: argparse.Namespace) -> LivePlan:
    if args.launcher != "file" or args.recover:
        raise ValueError(
            "--recovery live runs its own ranks and compares with --recover's "
            "path itself: drop --launcher torchrun and --recover"
        )
    names = [*_TRAIN_FIELDS, *_FAULT_FIELDS, "collective_timeout_s"]
    train = TRAIN_DEFAULTS["live"].replace(**_given(args, names), recovery=args.recovery)
    if args.heartbeat_timeout is not None:
        train = train.replace(heartbeat_timeout_s=args.heartbeat_timeout)
    restart, torchft = live.compared(args)
    target = args.target or "rank"
    if args.count is not None and target != "etcd":
        raise ValueError("--count goes with --target etcd: add it, or drop --count")
    if target != "rank":
        if args.rank is not None or args.host is not None:
            raise ValueError(f"--target {target} hits no rank: drop --rank and --host")
        rank = 0  # whose commit of the step before times the fault
        restart = restart and args.compare is not None  # nothing to compare with by default
    else:
        rank = host_rank(args.host, args.mode, args.nodes) if args.rank is None else args.rank
    chosen = LivePlan(
        rank=rank,
        target=target,
        count=args.count or 1,
        at_step=args.at_step,
        mode=args.mode,
        train=train,
        nodes=args.nodes,
        rejoin=args.rejoin,
        compare=restart,
        recovery=args.recovery,
        torchft=torchft,
        **common.run_fields(args),
    )
    if args.recovery == "torchft" or torchft:
        live.require_torchft(args.image)
    return chosen


def _lost_nodes(args: argparse.Namespace) -> tuple[int, ...]:
    """``--mode host`` under torchrun: every node on host ``--host`` (torchrun's rendezvous,
    not lab, decides which ranks run there)."""
    if args.mode != "host":
        return ()
    if args.rank is not None:
        raise ValueError("--launcher torchrun --mode host takes --host K, not --rank")
    return tuple(i for i, h in enumerate(current().layout(args.nodes)) if h == args.host)


def plan(args: argparse.Namespace) -> KillPlan | TorchrunKillPlan | LivePlan:
    if args.recovery in ("live", "torchft"):
        return _live_plan(args)
    live_only = [
        f
        for f in ("rejoin", "heartbeat_timeout", "no_compare", "compare", "target", "count")
        if getattr(args, f)
    ]
    if live_only:
        flag = "--" + live_only[0].replace("_", "-")
        raise ValueError(f"{flag} goes with --recovery live: add it, or drop {flag}")
    names = [*_TRAIN_FIELDS, *_FAULT_FIELDS, "collective_timeout_s"]
    shared = dict(
        rank=host_rank(args.host, args.mode, args.nodes) if args.rank is None else args.rank,
        at_step=args.at_step,
        mode=args.mode,
        train=TRAIN_DEFAULTS[args.launcher if args.launcher == "torchrun" else "restart"].replace(
            **_given(args, names)
        ),
        nodes=args.nodes,
        recover=args.recover,
        **common.run_fields(args),
    )
    torchrun_only = {"--procs-per-node": args.procs_per_node, "--max-restarts": args.max_restarts}
    if args.launcher == "torchrun":
        lost = _lost_nodes(args)
        return TorchrunKillPlan(
            **{**shared, "rank": 0 if lost else shared["rank"]},  # host: on rank 0's record
            procs_per_node=1 if args.procs_per_node is None else args.procs_per_node,
            max_restarts=1 if args.max_restarts is None else args.max_restarts,
            lost=lost,
        )
    for flag, value in torchrun_only.items():
        if value is not None:
            raise ValueError(
                f"{flag} goes with --launcher torchrun: pass that, or drop {flag} (the file "
                "launcher runs one rank per container and restarts nothing by itself)"
            )
    return KillPlan(**shared)


# Each path's module runs its plan and reports its result.
_PATHS: dict[type, Any] = {
    KillPlan: restart,
    TorchrunKillPlan: torchrun,
    LivePlan: live,
    KillResult: restart,
    TorchrunKillResult: torchrun,
    LiveResult: live,
}


def run(
    plan: KillPlan | TorchrunKillPlan | LivePlan,
) -> KillResult | TorchrunKillResult | LiveResult:
    return _PATHS[type(plan)].run(plan)


def report(result: KillResult | TorchrunKillResult | LiveResult) -> int:
    return _PATHS[type(result)].report(result)
