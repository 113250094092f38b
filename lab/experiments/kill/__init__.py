"""``python -m lab kill``: hit one rank of a run mid-step, report who noticed what, recover."""

from __future__ import annotations

import argparse
import dataclasses

from ddp.torchfree import TrainConfig, add_train_arguments, config_from_args, flag_of
from lab import args as common
from lab.engine.engines import current
from lab.experiments.kill import live, torchrun_run
from lab.experiments.kill.live import LivePlan, LiveResult, options
from lab.experiments.kill.live.plan import LIVE_TRAIN
from lab.experiments.kill.outputs import write_summary
from lab.experiments.kill.plan import DEFAULT_TRAIN, RUN_TIMEOUT_HELP, KillPlan
from lab.experiments.kill.result import KillResult
from lab.experiments.kill.run import run as run_file  # before run(): see lab.experiments
from lab.experiments.kill.summary import summarize
from lab.experiments.kill.torchrun_analysis import judge
from lab.experiments.kill.torchrun_outputs import write_report
from lab.experiments.kill.torchrun_plan import TorchrunKillPlan
from lab.experiments.kill.torchrun_result import TorchrunKillResult
from lab.experiments.up.plan import LAUNCHERS
from lab.faults import FAULTS
from lab.hostflags import add_host_target, host_rank
from lab.report.kill import kill_results, torchrun_kill_results
from lab.report.publish import publish
from lab.report.results import Results

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

_TRAIN_FIELDS: list[str] = []
# Of the "fault" group, what a user sets here; lab sets the checkpoint directory and --resume
# per phase, and --collective-timeout comes from lab.args like in every command.
_FAULT_FIELDS = ("checkpoint_every", "step_delay_ms")


def _add_fields(p: argparse.ArgumentParser, names: tuple[str, ...]) -> None:
    """Flags of single TrainConfig fields, their help and metavar from the field's metadata."""
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    group = p.add_argument_group("faults and recovery")
    for name in names:
        f, default = fields[name], getattr(DEFAULT_TRAIN, name)
        group.add_argument(
            flag_of(name),
            dest=name,
            type=type(f.default),
            default=default,
            metavar=f.metadata.get("metavar"),
            help=f"{f.metadata['help']} (default {default:g})",
        )


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
    p.add_argument(
        "--nodes",
        type=common.number(2, kind=int),
        default=4,
        help="containers, one rank each (default %(default)s; under torchrun "
        "--procs-per-node each)",
    )
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
    _TRAIN_FIELDS[:] = add_train_arguments(p, ("train",), defaults=DEFAULT_TRAIN)
    _add_fields(p, _FAULT_FIELDS)
    common.add_collective_timeout(p, DEFAULT_TRAIN.collective_timeout_s)
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
    # what was given (differs from the restart path's defaults) replaces the live defaults
    names = [*_TRAIN_FIELDS, "collective_timeout_s"]
    given = {f: getattr(args, f) for f in names if getattr(args, f) != getattr(DEFAULT_TRAIN, f)}
    train = LIVE_TRAIN.replace(**given, recovery=args.recovery)
    if args.heartbeat_timeout is not None:
        train = train.replace(heartbeat_timeout_s=args.heartbeat_timeout)
    restart, torchft = options.compared(args)
    live = LivePlan(
        rank=host_rank(args.host, args.mode, args.nodes) if args.rank is None else args.rank,
        at_step=args.at_step,
        mode=args.mode,
        train=train,
        nodes=args.nodes,
        rejoin=args.rejoin,
        compare=restart,
        run_timeout_s=args.run_timeout,
        image=args.image,
        runs_dir=args.runs_dir,
        progress=args.progress,
        recovery=args.recovery,
        torchft=torchft,
    )
    if args.recovery == "torchft" or torchft:
        options.require_torchft(args.image)
    return live


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
        f for f in ("rejoin", "heartbeat_timeout", "no_compare", "compare") if getattr(args, f)
    ]
    if live_only:
        flag = "--" + live_only[0].replace("_", "-")
        raise ValueError(f"{flag} goes with --recovery live: add it, or drop {flag}")
    names = [*_TRAIN_FIELDS, *_FAULT_FIELDS, "collective_timeout_s"]
    shared = dict(
        rank=host_rank(args.host, args.mode, args.nodes) if args.rank is None else args.rank,
        at_step=args.at_step,
        mode=args.mode,
        train=config_from_args(args, names, DEFAULT_TRAIN),
        nodes=args.nodes,
        recover=args.recover,
        run_timeout_s=args.run_timeout,
        image=args.image,
        runs_dir=args.runs_dir,
        progress=args.progress,
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


def run(
    plan: KillPlan | TorchrunKillPlan | LivePlan,
) -> KillResult | TorchrunKillResult | LiveResult:
    if isinstance(plan, LivePlan):
        return live.run(plan)
    if isinstance(plan, TorchrunKillPlan):
        return torchrun_run.run_torchrun_kill(plan)
    return run_file(plan)


def _publish(result: KillResult | TorchrunKillResult, made: Results) -> None:
    for line in publish(result.run_dir, made.page, made.summary, made.files, made.jobs):
        print(line)


def report(result: KillResult | TorchrunKillResult | LiveResult) -> int:
    if isinstance(result, LiveResult):
        return live.report(result)
    if isinstance(result.plan, TorchrunKillPlan):
        verdict = judge(result)
        write_report(result, verdict)
        _publish(result, torchrun_kill_results(result, verdict))
        print("\n".join(verdict.lines()))
        return 0 if verdict.ok else 1
    summary = summarize(result)
    write_summary(result, summary)
    _publish(result, kill_results(result, summary))
    print("\n".join(summary.lines(result.plan.at_step)))
    return 0 if summary.ok else 1
