"""Where a run starts: fresh, or after the newest complete checkpoint, and writing them.

``--resume`` demands a checkpoint (none is bad input); ``--auto-resume`` takes one when there
is one and starts fresh otherwise. The second is what a launcher that restarts workers needs
(torchrun ``--max-restarts``): the restarted command line is the one that started the run, so
"the checkpoint directory holds a complete checkpoint" has to be what means "resume".

Rank 0 writes the checkpoints, into the directory it sees. Where they resume from is agreed
over the process group, not read from a directory every rank shares: each rank names the
newest complete checkpoint it sees, the newest of those wins, and the lowest rank that has
it loads it and broadcasts the state. So ranks that share no filesystem (hosts with a volume
each; a torchrun restart that put the new rank 0 on another host) resume from one state, and
ranks that see one directory differently (a file renamed into place between two listings, a
network filesystem's cache) cannot train from different steps. Any complete checkpoint of
step K is the run's state at K (replicas are identical), so whose copy it is does not matter.
A half-written or damaged file is never loaded (``latest_checkpoint`` verifies length and
hash).
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from ddp.flight.recorder import FlightRecorder
from ddp.program.checkpoint import (
    checkpoint_path,
    latest_checkpoint,
    load_checkpoint,
    restore_rng_state,
    rng_state,
    save_checkpoint,
)
from ddp.program.config import TrainConfig
from ddp.program.outcome import BadInput
from ddp.program.reference import Reference

__all__ = ["NothingToResume", "Start", "agreed_start", "restore", "save"]

log = logging.getLogger("ddp")
_NONE = -1  # a rank that sees no complete checkpoint


class NothingToResume(BadInput, FileNotFoundError):
    """--resume found no complete checkpoint."""


class Start(NamedTuple):
    """The checkpoint every rank resumes from, and the rank that holds it."""

    step: int
    owner: int


def agreed_start(cfg: TrainConfig, rank: int, recorder: FlightRecorder) -> Start | None:
    """The newest checkpoint any rank sees, and the lowest rank seeing it; None to start
    fresh.

    Without ``--resume``/``--auto-resume`` this is None at once, with no collective (runs
    that never resume keep their collective sequence). Raises ``NothingToResume`` on every
    rank when ``--resume`` finds nothing.
    """
    if not (cfg.resume or cfg.auto_resume):
        return None
    assert cfg.checkpoints is not None
    found = latest_checkpoint(cfg.checkpoints)
    mine = torch.tensor([_NONE if found is None else found[0]], dtype=torch.int64)
    seen = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    with recorder.record("all_gather", step=0, nbytes=8 * len(seen)):
        dist.all_gather(seen, mine)
    steps = [int(t.item()) for t in seen]
    if max(steps) != _NONE:
        return Start(max(steps), steps.index(max(steps)))
    if cfg.resume:
        raise NothingToResume(
            f"--resume: no complete checkpoint in {cfg.checkpoints}; run with "
            "--checkpoint-every K first, pass --auto-resume to start fresh then, or drop --resume"
        )
    log.info(f"--auto-resume: no complete checkpoint in {cfg.checkpoints}, starting fresh")
    return None


def restore(
    cfg: TrainConfig,
    start: Start,
    module: nn.Module,
    opt: torch.optim.Optimizer,
    ref: Reference | None,
    recorder: FlightRecorder,
) -> list[int] | None:
    """Checkpoint ``start.step`` into this rank (model, optimizer, RNGs, rank 0's reference),
    loaded by its owner and broadcast; returns the bucket order the checkpointed run had
    (None: not rebuilt, or no DDP), for ``DistributedDataParallel.restore_bucket_order``."""
    assert cfg.checkpoints is not None
    path = checkpoint_path(cfg.checkpoints, start.step)
    box = [load_checkpoint(path) if dist.get_rank() == start.owner else None]
    with recorder.record("broadcast", step=0):
        dist.broadcast_object_list(box, src=start.owner)
    state = box[0]
    module.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    restore_rng_state(state["rng"])
    if ref is not None and "ref_model" in state:
        ref.model.load_state_dict(state["ref_model"])
        ref.opt.load_state_dict(state["ref_optimizer"])
    log.info(f"resumed from rank {start.owner}'s {path} (step {start.step})")
    return state.get("bucket_order")


def save(
    cfg: TrainConfig,
    step: int,
    module: nn.Module,
    opt: torch.optim.Optimizer,
    ref: Reference | None,
    bucket_order: list[int] | None = None,
) -> None:
    """Rank 0's checkpoint of ``step``. Replicas are identical, so rank 0's state is
    everyone's; the data position is the step. ``bucket_order``: DDP's, so a resumed run
    has the same buckets (``ddp.wrapper.reducer``)."""
    state = {"model": module.state_dict(), "optimizer": opt.state_dict(), "rng": rng_state()}
    if bucket_order is not None:
        state["bucket_order"] = list(bucket_order)
    if ref is not None:
        state |= {"ref_model": ref.model.state_dict(), "ref_optimizer": ref.opt.state_dict()}
    assert cfg.checkpoints is not None
    save_checkpoint(cfg.checkpoints, step, state)
