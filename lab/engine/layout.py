"""Which ranks run on which node: ``nodes`` containers with ``ranks_per_node`` ranks each."""

from __future__ import annotations

from dataclasses import dataclass

from lab.words import count

__all__ = ["Layout"]


def _check_int(name: str, value: object, minimum: int) -> None:
    # bool is an int subclass; `nodes: yes` in YAML must not become 1 node.
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class Layout:
    """Node ``i`` runs global ranks ``i*k .. i*k+k-1`` (``k = ranks_per_node``)."""

    nodes: int = 4
    ranks_per_node: int = 1

    def __post_init__(self) -> None:
        _check_int("--nodes", self.nodes, 1)
        _check_int("--ranks-per-node", self.ranks_per_node, 1)

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def name(self) -> str:
        return f"{self.nodes}x{self.ranks_per_node}"

    def ranks_of(self, node: int) -> list[int]:
        """Global ranks that run on ``node``."""
        if not 0 <= node < self.nodes:
            raise ValueError(f"node must be in 0..{self.nodes - 1}, got {node}")
        k = self.ranks_per_node
        return list(range(node * k, node * k + k))

    def node_of(self, rank: int) -> int:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in 0..{self.world_size - 1}, got {rank}")
        return rank // self.ranks_per_node

    def describe(self) -> str:
        """``4 nodes x 1 rank``, with the plurals right."""
        return f"{count(self.nodes, 'node')} x {count(self.ranks_per_node, 'rank')}"
