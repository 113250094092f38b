"""The lab's experiments, one package each, all of one shape (see :mod:`lab.experiments.base`).

The command line is built from :data:`EXPERIMENTS`: adding an experiment is a package here and
its name in this tuple. Every package names its files by their role, and data flows one way
through them: ``plan.py`` (the pure, validated plan) -> ``run.py`` (the run on the engine) ->
``result.py`` (what the run hands over) -> ``analysis.py`` (the figures from the rank logs, as
one summary object) -> ``outputs.py`` (the files), ``text.py`` (what is printed) and
``page.py`` (the run's page), each built from that summary alone; ``figures.py`` (plots) and
``link.py`` (a shaped link) serve them. ``lab kill`` has three such packages, one per path
(:mod:`.kill`). The sweeps share their run (:mod:`.sweep`), their report (:mod:`.reporting`)
and the per-step timeline (:mod:`.timeline`).

A package's ``run()`` is its ``run.py``'s, bound by ``from .run import run`` in the package:
Python binds a submodule as an attribute of its package when it is first imported, and the
from-import then rebinds the name to the function; later imports leave it alone. Defined in
the package and run.py imported lazily, ``run`` would become the module.
"""

from __future__ import annotations

__all__ = ["EXPERIMENTS"]

# lab.experiments.<name>
EXPERIMENTS = ("up", "latency", "kill", "straggler", "compress", "topology", "memory", "run")
