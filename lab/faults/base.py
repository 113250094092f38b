"""The shape of a fault: prepared ahead, injected fast, released whatever happened.

A fault hits one node of a started cluster. ``prepare`` does everything that can be done
before training (so the injection itself is one quick call and lands inside the step it is
aimed at), ``inject`` puts it in place, and ``release`` takes away whatever it left behind.
``release`` is idempotent and the fault is a context manager whose exit releases, so an error
or Ctrl-C between injection and the end of the phase leaves nothing behind (e.g. iptables
rules in a container that the next phase reuses).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

from lab.engine.client import GONE

if TYPE_CHECKING:
    from docker.models.containers import Container

    from lab.engine.cluster import Cluster

__all__ = ["Fault"]


class Fault(ABC):
    """One kind of fault; subclasses are registered in :data:`lab.faults.FAULTS`."""

    NAME: ClassVar[str]  # the --mode value
    HELP: ClassVar[str]  # one line for --help: what it does and how the peers notice
    ROLE: ClassVar[str]  # what the hit rank is called in the report, e.g. "SIGKILLed"
    NET_ADMIN: ClassVar[bool] = False  # the containers need CAP_NET_ADMIN
    # The hit rank stays alive and notices too (a partition: it times out like its peers);
    # otherwise only the others are expected to exit on their own.
    TARGET_NOTICES: ClassVar[bool] = False

    def __init__(self) -> None:
        self.cluster: Cluster | None = None
        self.node: int | None = None
        self.detail = ""  # what exactly was done, for the report (e.g. the cut addresses)
        # When the engine reports the fault in place (wall clock), if it does: tighter than
        # the start of the call that injected it (see Kill).
        self.landed_at: float | None = None

    def prepare(self, cluster: Cluster, node: int) -> None:
        """Before training: remember the target, and do what can be done ahead."""
        if not 0 <= node < len(cluster.nodes):
            raise ValueError(f"node must be in 0..{len(cluster.nodes) - 1}, got {node}")
        self.cluster, self.node = cluster, node

    @abstractmethod
    def inject(self) -> None:
        """Put the fault in place: fast, one Docker call or one exec."""

    def release(self) -> str | None:
        """Undo whatever the fault left (idempotent); returns what it did, or None."""
        return None

    def __enter__(self) -> Fault:
        return self

    def __exit__(self, *exc: object) -> None:
        # On the way out of an error the original exception matters more than ours.
        with contextlib.suppress(*GONE):
            self.release()

    def _container(self) -> Container:
        if self.cluster is None or self.node is None:
            raise RuntimeError(f"{self.NAME}: prepare(cluster, node) must come before inject()")
        return self.cluster.nodes[self.node].container
