"""Which ranks share a node, learned the same way on every rank.

A two-level allreduce only pays if it knows where the slow links are: ranks on one node talk
over loopback, ranks on different nodes over the network. Every rank names its node (the
``DDP_NODE`` environment variable where a launcher or a test sets it, else the host name) and
all ranks gather the names, so each builds the same :class:`Topology` from the same list.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass

import torch.distributed as dist

from ddp.wrapper.wire import all_gather_json

__all__ = ["NODE_ENV", "Topology", "gather_node_names"]

NODE_ENV = "DDP_NODE"


@dataclass(frozen=True)
class Topology:
    """The ranks of each node, nodes ordered by their lowest rank, ranks ascending.

    A node's leader is its lowest rank: it carries the node's sum across nodes.
    """

    nodes: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        ranks = sorted(r for node in self.nodes for r in node)
        if ranks != list(range(len(ranks))) or not ranks:
            raise ValueError(f"a topology must place ranks 0..N-1 once each, got {self.nodes}")
        assert all(list(node) == sorted(node) for node in self.nodes)

    @classmethod
    def from_names(cls, names: Sequence[str]) -> Topology:
        """Group rank i with every rank whose node name equals ``names[i]``."""
        by_name: dict[str, list[int]] = {}
        for rank, name in enumerate(names):
            by_name.setdefault(name, []).append(rank)
        return cls(tuple(tuple(ranks) for ranks in by_name.values()))

    @property
    def world_size(self) -> int:
        return sum(len(node) for node in self.nodes)

    @property
    def leaders(self) -> tuple[int, ...]:
        return tuple(node[0] for node in self.nodes)

    @property
    def is_flat(self) -> bool:
        """One node, or one rank per node: two levels would only add steps."""
        return len(self.nodes) == 1 or len(self.nodes) == self.world_size

    def node_of(self, rank: int) -> tuple[int, ...]:
        return next(node for node in self.nodes if rank in node)

    def describe(self) -> str:
        sizes = sorted({len(n) for n in self.nodes})
        per = f"{sizes[0]}" if len(sizes) == 1 else "/".join(str(len(n)) for n in self.nodes)
        return f"{len(self.nodes)} nodes x {per} ranks"


def gather_node_names(group: dist.ProcessGroup | None = None) -> list[str]:
    """Every rank's node name, in rank order; a collective on ``group`` (all ranks must call)."""
    mine = os.environ.get(NODE_ENV) or socket.gethostname()
    names = all_gather_json(mine, group=group)
    if not all(isinstance(n, str) for n in names):
        raise ValueError(f"node names must be strings, got {names}")
    return names
