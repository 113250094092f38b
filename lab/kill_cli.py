"""The ``kill`` subcommand of ``python -m lab``: its arguments, checked before anything starts.

Kept apart from :mod:`lab.cli`, which only registers :func:`add_parser` and dispatches to
:func:`run`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lab.fault_plan import MODES, FaultPlan
from lab.specs import DEFAULT_IMAGE

__all__ = ["add_parser", "plan_from_args", "run"]

_D = FaultPlan(rank=0, at_step=1, mode="kill")

_EPILOG = """\
Modes: kill = SIGKILL of the rank's container (docker kill): its peers notice at once;
pause = docker pause (frozen, like SIGSTOP): its peers wait for the collective timeout;
partition = iptables DROP of its traffic to and from the other nodes: every rank times out.
The last line names the missing rank, e.g.
  diagnosis: rank 2 missing at step 5 (allreduce of bucket 0, seq 10); ranks 0,1,3
    noticed after 30.0 s
With --recover, an uninterrupted run of the same length runs first, and after the fault every
rank resumes from the newest complete checkpoint; the last line then is
  recovered: final parameters bitwise identical to an uninterrupted run
Exit codes: 0 diagnosis names the rank that was hit (and recovery is bitwise identical),
1 otherwise, 2 bad arguments. Files: runs/<run-id>/report.json, <phase>/logs/rank<R>.jsonl,
<phase>/logs/flight/flight_rank<R>.json, <phase>/output.log, node<N>.log.
"""


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``kill`` on the ``python -m lab`` subcommands."""
    p = sub.add_parser(
        "kill",
        help="kill, pause or cut off one rank mid-run; diagnose; optionally recover",
        description="Inject a fault into one rank of a four-node run and report who noticed.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--rank", type=int, required=True, help="the rank to hit (one rank per node)")
    p.add_argument(
        "--at-step", type=int, required=True, help="the step (1-based) during which it lands"
    )
    p.add_argument("--mode", required=True, help=f"one of {', '.join(MODES)}")
    p.add_argument(
        "--timeout",
        type=float,
        default=_D.timeout_s,
        help="collective timeout in seconds of every rank (default %(default)g)",
    )
    p.add_argument(
        "--recover",
        action="store_true",
        help="resume from the last checkpoint and compare with an uninterrupted run",
    )
    p.add_argument("--steps", type=int, default=_D.steps, help="default %(default)s")
    p.add_argument("--nodes", type=int, default=_D.nodes, help="default %(default)s")
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=_D.checkpoint_every,
        metavar="K",
        help="rank 0 checkpoints every K steps, 0 = never (default %(default)s)",
    )
    p.add_argument(
        "--step-delay-ms",
        type=float,
        default=_D.step_delay_ms,
        help="sleep per step, the time the injection has to land (default %(default)g)",
    )
    p.add_argument("--image", default=DEFAULT_IMAGE, help="image (default %(default)s)")
    p.add_argument("--runs-dir", type=Path, default=Path("runs"), help="where runs/<run-id>/ go")
    return p


def plan_from_args(args: argparse.Namespace) -> FaultPlan:
    """The validated plan (ValueError naming the bad flag)."""
    return FaultPlan(
        rank=args.rank,
        at_step=args.at_step,
        mode=args.mode,
        timeout_s=args.timeout,
        steps=args.steps,
        nodes=args.nodes,
        checkpoint_every=args.checkpoint_every,
        recover=args.recover,
        step_delay_ms=args.step_delay_ms,
    )


def run(args: argparse.Namespace) -> int:
    from lab.faults import run_kill

    return run_kill(plan_from_args(args), image=args.image, runs_dir=args.runs_dir)
