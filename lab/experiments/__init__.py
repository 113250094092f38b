"""The lab's experiments, all of one shape (see :mod:`lab.experiments.base`).

The command line is built from :data:`EXPERIMENTS`: adding an experiment is a module or
package here and its name in this tuple. Data flows one way through an experiment: the pure,
validated plan -> the run on the engine -> the result it hands over -> the analysis (the
figures from the rank logs, as one summary object) -> the files, what is printed and the run's
page, each built from that summary alone.

``up``, ``topology``, ``straggler``, ``compress``, ``latency`` and ``memory`` are one module
each, read top to bottom in that order. ``run`` and ``kill`` are packages because each holds
several ideas: ``run`` the experiment (``run/run.py``) beside its faults, workers and hang;
``kill`` one module per recovery path (``restart``, ``torchrun``, ``live``), what they share
and the command. Beside them, what several experiments share: the run of a sweep
(:mod:`.sweep`), one job followed to its end (:mod:`.followed`), a link that changes during a
job (:mod:`.link_change`, :mod:`.changed_job`) and the per-step timeline (:mod:`.timeline`);
every experiment reports through :mod:`lab.report.report`.

A package's ``run()`` is its ``run.py``'s, bound by ``from .run import run`` in the package:
Python binds a submodule as an attribute of its package when it is first imported, and the
from-import then rebinds the name to the function; later imports leave it alone. Defined in
the package and run.py imported lazily, ``run`` would become the module.
"""

from __future__ import annotations

__all__ = ["EXPERIMENTS"]

# lab.experiments.<name>
EXPERIMENTS = ("up", "latency", "kill", "straggler", "compress", "topology", "memory", "run")
