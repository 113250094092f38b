"""``--mode host``: a whole host goes away, with every rank on it (its containers SIGKILLed at
once, as when a machine loses power).

On one engine every node is on host0, so this takes down every node and leaves no one to
notice: it is meant for ``--hosts``, where the hit rank's host is one of several. The kills go
out in parallel (one thread per container), so the host's ranks die within one Docker call's
time of each other and the survivors see one host lost, not a rank after a rank.
"""

from __future__ import annotations

import threading

from lab.faults.base import Fault

__all__ = ["HostDown"]


class HostDown(Fault):
    NAME = "host"
    HELP = (
        "every container of the rank's host (--host K) SIGKILLed at once: a host lost with its "
        "ranks (needs --hosts)"
    )
    ROLE = "lost with its host"

    def __init__(self) -> None:
        super().__init__()
        self.hit: list[int] = []  # the nodes on the host
        self.what = ""  # the detail without the ranks (under torchrun its rendezvous placed them)

    def prepare(self, cluster, node: int) -> None:  # type: ignore[no-untyped-def]
        super().prepare(cluster, node)
        host = cluster.nodes[node].host
        self.hit = [n.index for n in cluster.nodes if n.host == host]
        if len(self.hit) == len(cluster.nodes):
            raise ValueError(
                f"--mode host: every node runs on {host}, so no rank would be left to notice; "
                "spread the nodes with --hosts (and --placement)"
            )

    def inject(self) -> None:
        self._container()  # prepared first, or a RuntimeError saying so
        assert self.cluster is not None and self.node is not None
        nodes = self.cluster.nodes
        errors: list[BaseException] = []

        def kill(i: int) -> None:
            try:
                nodes[i].container.kill()
            except BaseException as e:  # reported below, from the caller's thread
                errors.append(e)

        threads = [threading.Thread(target=kill, args=(i,)) for i in self.hit]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        if errors:
            raise errors[0]
        ranks = [r for i in self.hit for r in nodes[i].ranks]
        self.what = (
            f"{nodes[self.node].host} down: docker kill of "
            f"{', '.join(f'node{i}' for i in self.hit)} at once"
        )
        self.detail = f"{self.what} (ranks {ranks})"
