"""A two-level allreduce as a communication hook: within each node, across nodes, within again.

gloo's flat ring allreduce takes 2(N-1) steps, and with ranks on several nodes every step waits
on the slow link between them. Here each node first reduces its gradients to its leader over
loopback, the M leaders allreduce across nodes (2(M-1) steps on the slow link, one node's sum
each), and each leader broadcasts the result within its node. Every rank ends with its leader's
bytes, so replicas stay bitwise identical. ``cross_dtype=torch.float16`` compresses only the
cross-node leg (the ``hierarchical-fp16`` hook); within a node the sums stay exact.

Ordering: the three collectives of a bucket depend on each other, and gloo pairs collectives by
the order they are issued on each group. Chaining them through future callbacks would issue
them from gloo's threads, in an order that can differ between ranks (the hazard PowerSGD's
``_InOrder`` guards against). So one thread per state issues every bucket's three steps, in
bucket order, which is the same on every rank; the caller's thread returns a future at once,
so backward keeps running while the thread talks.

Works with torch's ``DistributedDataParallel.register_comm_hook`` and with ours.
"""

# No ``from __future__ import annotations``: torch's register_comm_hook compares the hook's
# annotations with dist.GradBucket and Future[Tensor] objects, and strings would not match.
import queue
import threading
from typing import Any, Optional

import torch
import torch.distributed as dist

from ddp.wrapper.topology import Topology, gather_node_names

__all__ = ["HierarchicalState", "hierarchical_hook", "register_hierarchical"]


class HierarchicalState:
    """The groups of a two-level allreduce, and the one thread that issues its collectives.

    Construction is collective: every rank of the world must build it with the same topology,
    since ``dist.new_group`` is called for every node and for the leaders on every rank.
    """

    def __init__(
        self,
        topology: Topology,
        *,
        cross_dtype: Optional[torch.dtype] = None,  # noqa: UP045 (evaluated on py3.10)
    ) -> None:
        rank = dist.get_rank()
        if topology.world_size != dist.get_world_size():
            raise ValueError(
                f"the topology places {topology.world_size} ranks, the world has "
                f"{dist.get_world_size()}"
            )
        self.topology = topology
        self.cross_dtype = cross_dtype
        self.local: dist.ProcessGroup | None = None
        for node in topology.nodes:  # same order on every rank: new_group is collective
            group = dist.new_group(list(node)) if len(node) > 1 else None
            if rank in node:
                self.local = group
        self.cross = dist.new_group(list(topology.leaders))
        self.leader = topology.node_of(rank)[0]
        self.is_leader = rank == self.leader
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="ddp-hierarchical", daemon=True).start()

    def submit(self, buffer: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
        """Queue ``buffer`` (this rank's unaveraged bucket) for the two-level average."""
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        self._jobs.put((buffer, fut))
        return fut

    def _serve(self) -> None:
        while True:
            buffer, fut = self._jobs.get()
            try:
                self._average(buffer)
            except Exception as e:  # a failed collective fails the bucket, as allreduce would
                fut.set_exception(e)
            else:
                fut.set_result(buffer)

    def _average(self, buffer: torch.Tensor) -> None:
        buffer.div_(self.topology.world_size)  # divide first, as torch's allreduce hook does
        if self.local is not None:
            dist.reduce(buffer, dst=self.leader, group=self.local)
        if self.is_leader:
            if self.cross_dtype is None:
                dist.all_reduce(buffer, group=self.cross)
            else:
                wire = buffer.to(self.cross_dtype)
                dist.all_reduce(wire, group=self.cross)
                buffer.copy_(wire)
        if self.local is not None:
            dist.broadcast(buffer, src=self.leader, group=self.local)


def hierarchical_hook(
    state: "HierarchicalState", bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """``hook(state, bucket)`` for ``register_comm_hook``: the bucket's two-level average."""
    return state.submit(bucket.buffer())


def register_hierarchical(
    model: Any,
    process_group: dist.ProcessGroup | None = None,
    *,
    cross_dtype: torch.dtype | None = None,
    topology: Topology | None = None,
) -> HierarchicalState | None:
    """Register the two-level allreduce on ``model`` (ours or torch's DDP), learning the
    topology from every rank's node name unless given. On one node, or with one rank per node,
    registers nothing and returns None: the built-in flat allreduce is then the same algorithm
    at no extra cost. A collective: call it on every rank, once, before training."""
    if process_group is not None and process_group is not dist.group.WORLD:
        raise ValueError(
            "the hierarchical hook runs on the default (world) process group; "
            "pass process_group=None"
        )
    topology = topology or Topology.from_names(gather_node_names())
    if topology.is_flat:
        return None
    state = HierarchicalState(topology, cross_dtype=cross_dtype)
    model.register_comm_hook(state, hierarchical_hook)
    return state
