"""The shape every lab command has: a plugin is a module (or package) with these names.

Data flows one way: ``add_arguments`` (the flags) -> ``plan(args)`` (pure: a validated plan, or
``ValueError`` naming the bad flag, before any container exists: exit 2) -> ``run(plan)`` (the
engine: containers, jobs, records) -> ``report(result)`` (prints, returns the exit code).
"""

from __future__ import annotations

import argparse
from typing import Any, Protocol

__all__ = ["Command"]


class Command(Protocol):
    NAME: str  # the subcommand
    HELP: str  # one line in `python -m lab --help`
    DESCRIPTION: str  # the top of `python -m lab NAME --help`
    EPILOG: str  # the bottom (what it prints, files, exit codes)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def plan(self, args: argparse.Namespace) -> Any: ...

    def run(self, plan: Any) -> Any: ...

    def report(self, result: Any) -> int: ...
