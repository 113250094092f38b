"""Faults lab can inject into one node of a running cluster, by ``--mode`` name.

Each is a :class:`~lab.faults.base.Fault` (prepare ahead, inject fast, release always);
:data:`FAULTS` is the registry the command line and the plan take their choices from, so a
new fault is a module here and one entry below.
"""

from __future__ import annotations

from lab.faults.base import Fault
from lab.faults.host import HostDown
from lab.faults.kill import Kill
from lab.faults.partition import Partition
from lab.faults.pause import Pause

__all__ = ["FAULTS", "Fault"]

FAULTS: dict[str, type[Fault]] = {f.NAME: f for f in (Kill, Pause, Partition, HostDown)}
