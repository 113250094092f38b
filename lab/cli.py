"""``python -m lab``: the command line, built from the registry of commands.

Every command is a plugin of one shape (:mod:`lab.experiments.base`): its flags, a pure plan
(bad input is refused here, before any container exists: exit 2 with the subcommand's usage),
a run on the engine, and a report that returns the exit code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys
from collections.abc import Sequence
from types import ModuleType

from lab.experiments import EXPERIMENTS
from lab.hostflags import add_host_flags, check_nodes, host_set, reach
from lab.tools import TOOLS

__all__ = ["build_parser", "commands", "main"]

_EXAMPLES = """\
examples:
  python -m lab image                               # once: the lab image
  python -m lab up                                  # 4 nodes x 1 rank to the parity verdict
  python -m lab up --topology lab/topologies/2x2.yaml
  python -m lab latency --ms 5                      # bucketing and overlap under link delay
  python -m lab kill --rank 2 --at-step 5 --mode pause
  python -m lab straggler --quick                   # one slow rank makes every step slow
  python -m lab topology --quick                    # 2 nodes x 2 ranks: flat ring vs two levels
  python -m lab memory --quick                      # sharded Adam fits where DDP's is killed
  python -m lab run --nodes 2 --ranks-per-node 2 --ms 5 -- python train.py   # your own script
  python -m lab parity runs/<run-id>
  python -m lab down

exit codes: 0 success (parity holds), 1 failure (parity broken, a rank or the engine failed),
2 bad arguments, 130 interrupted. `python -m lab COMMAND --help` says more per command."""


def commands() -> dict[str, ModuleType]:
    """Name -> plugin module, tools first, then the experiments."""
    mods = [importlib.import_module(f"lab.tools.{n}") for n in TOOLS]
    mods += [importlib.import_module(f"lab.experiments.{n}") for n in EXPERIMENTS]
    return {m.NAME: m for m in mods}


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(
        prog="python -m lab",
        description="The Docker lab: data-parallel training across containers, and "
        "experiments that show why DDP is built the way it is.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    subparsers = {}
    for name, mod in commands().items():
        p = sub.add_parser(
            name,
            help=mod.HELP,
            description=mod.DESCRIPTION,
            epilog=mod.EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        mod.add_arguments(p)
        if name in EXPERIMENTS:
            add_host_flags(p)
        subparsers[name] = p
    return parser, subparsers


def _refuse(parser: argparse.ArgumentParser, error: Exception) -> int:
    print(f"{parser.prog}: error: {error}", file=sys.stderr)
    return 2


def _as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """Exit codes: 0 success, 1 failure, 2 bad arguments, 130 interrupted."""
    from ddp.torchfree import LogError
    from lab.engine import cluster
    from lab.engine.client import EngineUnreachable, LabError
    from lab.engine.distribute import hosts_arg
    from lab.engine.placement import using
    from lab.report.failed import guarded

    parser, subparsers = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # argparse would report these with the top-level usage
        subparsers[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    mod = commands()[args.command]
    try:  # the hosts' refusals are one line: the usage says nothing about engines
        hosts = host_set(args)
    except ValueError as e:
        return _refuse(subparsers[args.command], e)
    try:
        with using(hosts):  # a plan may place things on hosts (lab kill --host K)
            plan = mod.plan(args)
    except ValueError as e:
        subparsers[args.command].error(str(e))
    try:
        check_nodes(hosts, plan)
        reach(hosts)
    except (ValueError, EngineUnreachable) as e:
        return _refuse(subparsers[args.command], e)
    # `kill <pid>`, a CI job's timeout, `docker stop` of a wrapper: cleaned up as for Ctrl-C
    # (Python's default SIGTERM ends at once, skipping every context manager's cleanup).
    previous = signal.signal(signal.SIGTERM, _as_interrupt)
    try:
        # guarded: a run that raises after its cluster started still leaves its failure page
        with using(hosts):
            return mod.report(guarded(mod.NAME, mod.run)(plan))
    except (LabError, LogError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        on = f" --hosts {hosts_arg(hosts.hosts)}" if hosts.several else ""
        downs = "; ".join(f"python -m lab down --run {r}{on}" for r in cluster.STARTED)
        left = f" (if anything is left: {downs})" if downs else ""
        print(f"interrupted; cleaned up{left}", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
