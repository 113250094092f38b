"""``python -m lab parity DIR``: re-judge parity offline from any run's collected logs."""

from __future__ import annotations

import argparse
from pathlib import Path

from ddp.torchfree import ParityReport, check_logs

NAME = "parity"
HELP = "re-check the parity of a collected run offline, from its rank logs"
DESCRIPTION = (
    "Rebuild the parity table and verdict from rank<R>.jsonl logs: a run directory of any lab "
    "command (every job in it that has rank logs), one job's directory, or a log directory of "
    "`python -m ddp --log-dir`."
)
EPILOG = "Exit codes: 0 parity holds in every job found, 1 it does not, 2 no such directory."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, help="runs/<run-id>, runs/<run-id>/<job>, or a log dir")


def log_dirs(root: Path) -> list[Path]:
    """Every directory under ``root`` (itself included) that holds rank logs, sorted."""
    return sorted({p.parent for p in root.rglob("rank*.jsonl")})


def plan(args: argparse.Namespace) -> list[Path]:
    root: Path = args.run_dir
    if not root.exists():
        raise ValueError(f"{root} not found: pass a run directory, e.g. runs/<run-id>")
    if not root.is_dir():
        raise ValueError(f"{root} is not a directory: pass a run directory, e.g. runs/<run-id>")
    found = log_dirs(root)
    if not found:
        raise ValueError(f"no rank*.jsonl logs under {root}: is it a run directory?")
    return found


def run(dirs: list[Path]) -> list[tuple[Path, ParityReport]]:
    return [(d, check_logs(d)) for d in dirs]


def report(results: list[tuple[Path, ParityReport]]) -> int:
    for d, rep in results:
        if len(results) > 1:
            print(f"== {d}")
        print(rep.table())
        print(rep.verdict)
    return 0 if all(rep.holds for _, rep in results) else 1
