"""Healing: a member that is behind receives the weights, the optimizer state and the step
number from a healthy member over the new group, not from disk.

Right after a quorum's group is built, every member all-gathers ``[step, checksum,
has_momentum]``. The source is the lowest group rank at the highest step. A member is behind
when its step is lower (a replacement starts at 0; a member whose commit vote failed while the
others' passed is one step back) or when its checksum differs from the source's at the same
step. The source sends each one that is behind a single flat float32 buffer (parameters,
buffers, SGD momentum) with ``send``/``recv``; the step number and the per-step history (for
the final verdict) come through the store. After it every member holds the source's bits.
The same exchange tells the members at the top step whether they were identical after the
last committed step, which a check that failed mid-gather could not say.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ddp.program.reference import checksum
from ddp.recovery.failpoints import failpoint
from ddp.recovery.member import Member
from ddp.recovery.protocol import keys
from ddp.recovery.waiting import wait_work

__all__ = ["Heal", "heal"]


@dataclass(frozen=True)
class Heal:
    """What the exchange found. ``source``: group rank of the healer; ``healed``: the group
    ranks that received its state; ``seconds`` and ``nbytes``: this rank's transfer (0 when it
    took no part)."""

    source: int
    healed: tuple[int, ...]
    step: int
    identical: bool  # the members already at ``step`` agreed bitwise before any transfer
    nbytes: int = 0
    seconds: float = 0.0


def _state(module: nn.Module, opt: torch.optim.Optimizer, momentum: bool) -> list[torch.Tensor]:
    tensors = [*module.parameters(), *module.buffers()]
    if momentum:
        for p in module.parameters():
            state = opt.state[p]
            if state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(p)  # overwritten by the source's
            tensors.append(state["momentum_buffer"])
    return tensors


def _has_momentum(module: nn.Module, opt: torch.optim.Optimizer) -> bool:
    return any(opt.state[p].get("momentum_buffer") is not None for p in module.parameters())


@torch.no_grad()
def heal(
    member: Member,
    pg: dist.ProcessGroup,
    qid: int,
    module: nn.Module,
    opt: torch.optim.Optimizer,
    step: int,
    history: list[dict],
    timeout_s: float,
) -> tuple[Heal, int, list[dict]]:
    """Run the exchange on every member of the new group; returns what it found, this rank's
    step and history afterwards (the source's, if this rank was behind)."""
    me, world = pg.rank(), pg.size()
    mine = torch.tensor([step, checksum(module), _has_momentum(module, opt)], dtype=torch.float64)
    everyone = [torch.empty_like(mine) for _ in range(world)]
    wait_work(pg.allgather([everyone], [mine]), member, timeout_s, "the heal exchange")
    table = torch.stack(everyone)
    top = int(table[:, 0].max())
    src = int((table[:, 0] == top).nonzero()[0])
    at_top = table[:, 0] == top
    identical = bool((table[at_top, 1] == table[src, 1]).all())
    behind = tuple(g for g in range(world) if not (at_top[g] and table[g, 1] == table[src, 1]))
    if not behind:
        return Heal(src, (), top, identical), step, history
    t0 = time.perf_counter()
    flat_parts = _state(module, opt, bool(table[src, 2]))
    assert all(t.dtype == torch.float32 for t in flat_parts), "one flat float32 buffer"
    nbytes = sum(t.numel() * t.element_size() for t in flat_parts)
    if me == src:
        member.store.set(keys.history(qid), json.dumps(history))
        flat = torch.cat([t.reshape(-1) for t in flat_parts])
        failpoint("heal.sending", step=top)
        for g in behind:
            wait_work(pg.send([flat], g, qid), member, timeout_s, f"heal send to group rank {g}")
    elif me in behind:
        flat = torch.empty(nbytes // 4, dtype=torch.float32)
        failpoint("heal.receiving", step=top)
        wait_work(pg.recv([flat], src, qid), member, timeout_s, "heal receive")
        for t, piece in zip(flat_parts, flat.split([t.numel() for t in flat_parts]), strict=True):
            t.copy_(piece.view_as(t))
        step, history = top, json.loads(member.store.get(keys.history(qid)))
    else:
        return Heal(src, behind, top, identical), step, history
    return Heal(src, behind, top, identical, nbytes, time.perf_counter() - t0), step, history
