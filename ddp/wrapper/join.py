"""Uneven inputs: what a rank that ran out of batches does so the others do not hang.

Under ``torch.distributed.algorithms.join.Join`` (or ``model.join()``), each training forward of
a rank that still has inputs issues, in this order:

1. Join's notify: an allreduce of 1 (``Join.notify_join_context``); a joined rank's Join loop
   shadows it with 0, so the sum is the number of ranks still training.
2. ``agree_on_forward``: one MAX-allreduce of ``[sync backward?, broadcast buffers?, rank]``:
   joined ranks learn what to shadow, and everyone learns which rank's buffers to broadcast
   (the highest rank still training: rank 0 may have joined and hold stale buffers).
3. The buffer broadcast, if any; the bucket rebuild's broadcast, once (``reducer``);
   then backward's bucket collectives.

A joined rank's ``main_hook`` (called by Join once per iteration of the others) mirrors 2 and 3,
contributing zero gradients (and zero "no gradient here" counts, so a count equal to the number
of training ranks means "unused everywhere"). When every rank has joined, ``post_hook``
broadcasts the model from the last rank to join, so all replicas end identical.
``divide_by_initial_world_size=False`` divides by the number of training ranks instead of the
world size (the default path only: a comm hook decides its own divisor, as in torch).

Everything here takes the wrapper's parts as arguments (its reducer, group and buffers), so
this module does not know the wrapper class.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join, Joinable, JoinHook

from ddp.wrapper.comm import broadcast_coalesced, recorded
from ddp.wrapper.reducer import Reducer

__all__ = [
    "DDPJoinHook",
    "agree_on_forward",
    "before_forward",
    "final_state",
    "ranks_training",
    "sync_buffers_from",
]


def agree_on_forward(
    process_group: dist.ProcessGroup | None,
    *,
    sync_backward: bool,
    broadcast_buffers: bool,
    joined: bool,
) -> tuple[bool, bool, int]:
    """(any rank syncs gradients, any rank broadcasts buffers, the rank to broadcast from)."""
    rank = -1 if joined else dist.get_rank(process_group)
    t = torch.tensor([int(sync_backward), int(broadcast_buffers), rank], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=process_group)
    sync, bcast, src = t.tolist()
    return bool(sync), bool(bcast), int(src)


def sync_buffers_from(
    buffers: Sequence[torch.Tensor],
    process_group: dist.ProcessGroup | None,
    src: int,
    reducer: Reducer,
) -> None:
    """Broadcast ``buffers`` from group rank ``src``, recorded under the reducer's step."""
    with recorded(reducer.recorder, "broadcast_buffers", step=reducer.step):
        broadcast_coalesced(buffers, process_group, src=src)


def before_forward(
    joinable: Joinable,
    process_group: dist.ProcessGroup | None,
    reducer: Reducer,
    buffers: Sequence[torch.Tensor],
    *,
    sync: bool,
    bcast: bool,
) -> dist.Work | None:
    """A training rank's collectives before its module's forward: 1 and 2 above under Join,
    then the buffer broadcast (``bcast``); ``sync``: this forward's backward syncs gradients.
    Returns Join's notify (for ``ranks_training``), or None outside Join."""
    if not joinable._join_config.enable:
        if bcast:
            sync_buffers_from(buffers, process_group, 0, reducer)
        return None
    work = Join.notify_join_context(joinable)
    _, _, src = agree_on_forward(
        process_group, sync_backward=sync, broadcast_buffers=bcast, joined=False
    )
    if bcast:
        sync_buffers_from(buffers, process_group, src, reducer)
    return work


def ranks_training(notify: dist.Work | None) -> int | None:
    """How many ranks still train under Join (None outside one): Join's notify is an allreduce
    of 1 per rank still training (Work.result() is deprecated; the future carries the same
    tensor)."""
    if notify is None:
        return None
    return round(notify.get_future().wait()[0].item())


def final_state(module: nn.Module, with_buffers: bool) -> list[torch.Tensor]:
    """What the last rank to join broadcasts to all: the model, and its buffers if the wrapper
    broadcasts buffers at all."""
    tensors = list(module.parameters())
    if with_buffers:
        tensors += list(module.buffers())
    return tensors


class DDPJoinHook(JoinHook):
    """torch's ``_DDPJoinHook`` contract for one wrapper (see the module docstring).

    ``rebuild_buckets``: the wrapper's rebuild, which the training ranks run once before a
    forward (``reducer``); ``final_state``: the tensors the last joiner broadcasts."""

    def __init__(
        self,
        reducer: Reducer,
        process_group: dist.ProcessGroup | None,
        buffers: Sequence[torch.Tensor],
        rebuild_buckets: Callable[[], bool],
        final_state: Callable[[], list[torch.Tensor]],
    ) -> None:
        super().__init__()
        self.reducer = reducer
        self.process_group = process_group
        self.buffers = buffers
        self.rebuild_buckets = rebuild_buckets
        self.final_state = final_state

    def main_hook(self) -> None:
        """Shadow one training iteration of the ranks that still have inputs."""
        sync, bcast, src = agree_on_forward(
            self.process_group, sync_backward=False, broadcast_buffers=False, joined=True
        )
        if bcast:
            sync_buffers_from(self.buffers, self.process_group, src, self.reducer)
        if sync:
            self.rebuild_buckets()  # when the training ranks do (ddp.wrapper.reducer)
            reducer = self.reducer
            with recorded(reducer.recorder, "join_shadow_backward", step=reducer.step):
                reducer.shadow_backward()

    def post_hook(self, is_last_joiner: bool) -> None:
        """Every rank takes the model of (the highest of) the last ranks to join."""
        group = self.process_group
        rank = dist.get_rank(group) if is_last_joiner else -1
        t = torch.tensor([rank], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        src = int(t.item())
        assert src >= 0, "at least one rank is a last joiner"
        tensors = self.final_state()
        with recorded(self.reducer.recorder, "join_final_sync", step=self.reducer.step):
            broadcast_coalesced(tensors, group, src=src)
