"""The lab's experiments, one package each, all of one shape (see :mod:`lab.experiments.base`).

The command line is built from :data:`EXPERIMENTS`: adding an experiment is a package here and
its name in this tuple.
"""

from __future__ import annotations

__all__ = ["EXPERIMENTS"]

EXPERIMENTS = ("up", "latency", "kill", "straggler", "compress")  # lab.experiments.<name>
