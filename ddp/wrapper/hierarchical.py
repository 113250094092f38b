"""A two-level allreduce as a communication hook: within each node, across nodes, within again.

gloo's flat ring allreduce takes 2(N-1) steps, and with ranks on several nodes every step waits
on the slow link between them. Here each node first reduces its gradients to its leader over
loopback, the M leaders allreduce across nodes (2(M-1) steps on the slow link, one node's sum
each), and each leader broadcasts the result within its node. Every rank ends with its leader's
bytes, so replicas stay bitwise identical. How the leaders sum is a parameter
(``cross_algorithm``: gloo's ring, a direct exchange that crosses the link once, or recursive
doubling; :mod:`ddp.wrapper.cross_node`), and may change between iterations.
``cross_dtype=torch.float16`` compresses only the cross-node leg (the ``hierarchical-fp16``
hook); within a node the sums stay exact.

Ordering: the three collectives of a bucket depend on each other, and gloo pairs collectives by
the order they are issued on each group. Chaining them through future callbacks would issue
them from gloo's threads, in an order that can differ between ranks (the hazard PowerSGD's
``_InOrder`` guards against). So one thread per state issues every bucket's steps, in bucket
order, which is the same on every rank; the caller's thread returns a future at once, so
backward keeps running while the thread talks. The thread keeps one bucket's cross-node
allreduce in flight while it reduces the next bucket within the node, so two slow-link round
trips overlap, as two buckets' flat allreduces do on gloo's worker threads.

Works with torch's ``DistributedDataParallel.register_comm_hook`` and with ours.
"""

# No ``from __future__ import annotations``: torch's register_comm_hook compares the hook's
# annotations with dist.GradBucket and Future[Tensor] objects, and strings would not match.
import queue
import threading
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist

from ddp.wrapper.cross_node import fits, start
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
        cross_algorithm: str = "ring",
    ) -> None:
        rank = dist.get_rank()
        if topology.world_size != dist.get_world_size():
            raise ValueError(
                f"the topology places {topology.world_size} ranks, the world has "
                f"{dist.get_world_size()}"
            )
        if not fits(cross_algorithm, len(topology.leaders)):
            raise ValueError(
                f"{cross_algorithm} cannot run among {len(topology.leaders)} node leaders"
            )
        self.topology = topology
        self.cross_dtype = cross_dtype
        # read by the issuing thread per bucket; change it only between iterations
        self.cross_algorithm = cross_algorithm
        self._sequence = 0  # cross-node exchanges issued: the same count on every leader
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

    def submit(self, buffer: torch.Tensor, is_last: bool) -> torch.futures.Future[torch.Tensor]:
        """Queue ``buffer`` (this rank's unaveraged bucket) for the two-level average."""
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        self._jobs.put((buffer, is_last, fut))
        return fut

    def _serve(self) -> None:
        # A one-bucket lag: bucket b's cross-node allreduce is still in flight while bucket
        # b+1 is reduced within the node, and b is broadcast only after that. Every rank
        # issues the same sequence (reduce 0, reduce 1, broadcast 0, reduce 2, broadcast 1, ...,
        # then the last broadcast once is_last), so gloo pairs the collectives alike everywhere.
        pending: _Leg | None = None
        while True:
            buffer, is_last, fut = self._jobs.get()
            try:
                current = self._start(buffer, fut)
                if pending is not None:
                    self._finish(pending)
                pending = current
                if is_last:
                    self._finish(pending)
                    pending = None
            except Exception as e:  # a failed collective fails the buckets, as allreduce would
                for leg_fut in (fut, pending.fut if pending is not None else None):
                    if leg_fut is not None and not leg_fut.done():
                        leg_fut.set_exception(e)
                pending = None

    def _start(self, buffer: torch.Tensor, fut: torch.futures.Future) -> "_Leg":
        """Sum the node into its leader and start the cross-node allreduce (leaders only)."""
        buffer.div_(self.topology.world_size)  # divide first, as torch's allreduce hook does
        if self.local is not None:
            dist.reduce(buffer, dst=self.leader, group=self.local)
        wire, work = buffer, None
        if self.is_leader:
            wire = buffer if self.cross_dtype is None else buffer.to(self.cross_dtype)
            leaders = self.topology.leaders
            work = start(self.cross_algorithm, wire, self.cross, leaders, self._sequence)
            self._sequence += 1
        return _Leg(buffer, wire, work, fut)

    def _finish(self, leg: "_Leg") -> None:
        """Wait for the cross-node result and hand it to every rank of the node."""
        if leg.work is not None:
            leg.work.wait()
            if leg.wire is not leg.buffer:
                leg.buffer.copy_(leg.wire)
        if self.local is not None:
            dist.broadcast(leg.buffer, src=self.leader, group=self.local)
        leg.fut.set_result(leg.buffer)


@dataclass
class _Leg:
    """One bucket between its within-node reduce and its broadcast."""

    buffer: torch.Tensor
    wire: torch.Tensor  # the buffer, or its fp16 copy for the cross-node leg
    work: Any  # the cross-node exchange in flight (leaders), else None
    fut: torch.futures.Future


def hierarchical_hook(
    state: "HierarchicalState", bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """``hook(state, bucket)`` for ``register_comm_hook``: the bucket's two-level average."""
    return state.submit(bucket.buffer(), bucket.is_last())


def register_hierarchical(
    model: Any,
    process_group: dist.ProcessGroup | None = None,
    *,
    cross_dtype: torch.dtype | None = None,
    topology: Topology | None = None,
    cross_algorithm: str = "ring",
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
    state = HierarchicalState(topology, cross_dtype=cross_dtype, cross_algorithm=cross_algorithm)
    model.register_comm_hook(state, hierarchical_hook)
    return state
