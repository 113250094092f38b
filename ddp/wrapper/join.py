"""Uneven inputs: what a rank that ran out of batches does so the others do not hang.

Under ``torch.distributed.algorithms.join.Join`` (or ``model.join()``), each training forward of
a rank that still has inputs issues, in this order:

1. Join's notify: an allreduce of 1 (``Join.notify_join_context``); a joined rank's Join loop
   shadows it with 0, so the sum is the number of ranks still training.
2. ``agree_on_forward``: one MAX-allreduce of ``[sync backward?, broadcast buffers?, rank]``:
   joined ranks learn what to shadow, and everyone learns which rank's buffers to broadcast
   (the highest rank still training: rank 0 may have joined and hold stale buffers).
3. The buffer broadcast, if any; the bucket rebuild's broadcast, once (``bucket_rebuild``);
   then backward's bucket collectives.

A joined rank's ``main_hook`` (called by Join once per iteration of the others) mirrors 2 and 3,
contributing zero gradients (and zero "no gradient here" counts, so a count equal to the number
of training ranks means "unused everywhere"). When every rank has joined, ``post_hook``
broadcasts the model from the last rank to join, so all replicas end identical.
``divide_by_initial_world_size=False`` divides by the number of training ranks instead of the
world size (the default path only: a comm hook decides its own divisor, as in torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import JoinHook

from ddp.wrapper.comm import broadcast_coalesced

if TYPE_CHECKING:
    from ddp.wrapper.distributed import DistributedDataParallel

__all__ = ["DDPJoinHook", "agree_on_forward", "sync_buffers_from"]


def agree_on_forward(
    ddp: DistributedDataParallel, *, sync_backward: bool, broadcast_buffers: bool, joined: bool
) -> tuple[bool, bool, int]:
    """(any rank syncs gradients, any rank broadcasts buffers, the rank to broadcast from)."""
    rank = -1 if joined else dist.get_rank(ddp.process_group)
    t = torch.tensor([int(sync_backward), int(broadcast_buffers), rank], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ddp.process_group)
    sync, bcast, src = t.tolist()
    return bool(sync), bool(bcast), int(src)


def sync_buffers_from(ddp: DistributedDataParallel, src: int) -> None:
    with ddp._recorded("broadcast_buffers", step=ddp.wrapper.reducer.step):
        broadcast_coalesced(ddp._buffers_to_sync, ddp.process_group, src=src)


class DDPJoinHook(JoinHook):
    """torch's ``_DDPJoinHook`` contract for this wrapper (see the module docstring)."""

    def __init__(self, ddp: DistributedDataParallel, divide_by_initial_world_size: bool) -> None:
        super().__init__()
        self.ddp = ddp
        ddp._divide_by_initial_world_size = divide_by_initial_world_size
        ddp._logging.data["join_uneven_inputs"] = 1

    def main_hook(self) -> None:
        """Shadow one training iteration of the ranks that still have inputs."""
        ddp = self.ddp
        sync, bcast, src = agree_on_forward(
            ddp, sync_backward=False, broadcast_buffers=False, joined=True
        )
        if bcast:
            sync_buffers_from(ddp, src)
        if sync:
            ddp._rebuild_buckets()  # when the training ranks do (ddp.wrapper.bucket_rebuild)
            with ddp._recorded("join_shadow_backward", step=ddp.wrapper.reducer.step):
                ddp.wrapper.reducer.shadow_backward()

    def post_hook(self, is_last_joiner: bool) -> None:
        """Every rank takes the model of (the highest of) the last ranks to join."""
        ddp = self.ddp
        rank = dist.get_rank(ddp.process_group) if is_last_joiner else -1
        t = torch.tensor([rank], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ddp.process_group)
        src = int(t.item())
        assert src >= 0, "at least one rank is a last joiner"
        tensors = list(ddp.module.parameters())
        if ddp.broadcast_buffers:
            tensors += list(ddp.module.buffers())
        with ddp._recorded("join_final_sync", step=ddp.wrapper.reducer.step):
            broadcast_coalesced(tensors, ddp.process_group, src=src)
