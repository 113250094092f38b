"""One step of a live run: forward and backward on this rank's shard of the global batch
(gradients averaged by the wrapper, every wait interruptible), the commit vote, the optimizer
step only if the vote passed, then the check every member takes part in (checksums, and the
reference on group rank 0).

The commit vote is one allreduce (MAX) of ``[no, newest quorum id heard of]``: a member that
failed never gets here, and its peers' vote then fails too, so no member applies a step that
another could not. The second entry makes every member agree at the same step boundary to
move to a quorum the coordinator formed for ranks that joined.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ddp.program.config import TrainConfig
from ddp.program.parity import StepRow
from ddp.program.records import RecordLog, StepRecord
from ddp.program.reference import Reference, checksum, max_param_diff
from ddp.recovery.batches import GlobalBatches
from ddp.recovery.member import Member
from ddp.recovery.protocol import Quorum
from ddp.recovery.records import CommitRecord
from ddp.recovery.waiting import QuorumLost, wait_work
from ddp.wrapper.distributed import DistributedDataParallel

__all__ = ["LiveRun", "run_step"]

log = logging.getLogger("ddp")


@dataclass
class LiveRun:
    """One rank's live run: what it trains, and where it stands in the protocol."""

    cfg: TrainConfig
    replica: int
    jlog: RecordLog
    x: torch.Tensor
    y: torch.Tensor
    batches: GlobalBatches
    module: nn.Module
    opt: torch.optim.Optimizer
    started_t: float
    member: Member | None = None
    step: int = 0  # the last step committed
    attempting: int | None = None  # the step under way, until it commits
    quorum: Quorum | None = None
    group_rank: int = 0
    pg: Any = None
    model: DistributedDataParallel | None = None
    ref: Reference | None = None  # group rank 0's single-process reference
    history: list[dict] = field(default_factory=list)
    failed: int = 0
    quorums: int = 0


def _reference_step(run: LiveRun, step: int) -> float:
    """The reference's step on the whole global batch of ``step`` (all micro-batches)."""
    k, ref = run.cfg.accumulate, run.ref
    idx = torch.cat([run.batches.indices((step - 1) * k + j) for j in range(k)])
    ref.opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(ref.model(run.x[idx]), run.y[idx])
    loss.backward()
    ref.opt.step()
    return loss.item()


def _vote(run: LiveRun, step: int) -> None:
    v = torch.tensor([0, run.member.latest], dtype=torch.int64)
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.MAX
    timeout = run.cfg.collective_timeout_s
    wait_work(run.pg.allreduce([v], opts), run.member, timeout, f"commit vote of step {step}")
    if int(v[0]):
        raise QuorumLost(f"a member voted against step {step}", "self")
    run.member.latest = max(run.member.latest, int(v[1]))


def run_step(run: LiveRun, step: int) -> None:
    """Train ``step`` in the current quorum; ``QuorumLost`` leaves the weights untouched."""
    cfg, model, world = run.cfg, run.model, run.quorum.world_size
    run.attempting = step
    model.reducer.step = step
    if run.ref is not None:
        run.ref.anchor(run.module, run.opt)
    wall0, t0 = time.time(), time.perf_counter()
    run.opt.zero_grad(set_to_none=True)
    k, share = cfg.accumulate, 0.0
    for micro in range(k):
        idx, scale = run.batches.shard((step - 1) * k + micro, run.group_rank, world)
        last = micro == k - 1
        with contextlib.nullcontext() if last else model.no_sync():
            loss_t = F.cross_entropy(model(run.x[idx]), run.y[idx])
            if cfg.step_delay_ms and last:
                time.sleep(cfg.step_delay_ms / 1e3)
            (loss_t * (scale / k) if scale != 1.0 or k > 1 else loss_t).backward()
        share += loss_t.item() * len(idx) / cfg.batch_size / k
    comm_ms = model.reducer.last_comm_wait_s * 1e3
    _vote(run, step)
    run.opt.step()  # committed: from here on this step counts
    run.step, run.attempting = step, None
    step_ms = (time.perf_counter() - t0) * 1e3
    q = run.quorum
    run.jlog.write(CommitRecord(run.replica, step, q.id, world, True, time.time()))
    _check(run, step, share, step_ms, comm_ms, wall0)


def _check(run: LiveRun, step: int, share: float, step_ms: float, comm_ms: float, wall0: float):
    """Every member gathers (loss share, checksum, times, reference diff): each learns
    whether the replicas agree, and keeps the entry for the final verdict."""
    mine_sum, extra = checksum(run.module), {}
    if run.ref is not None:
        extra["ref_loss"] = _reference_step(run, step)
        extra["ref_checksum"] = checksum(run.ref.model)
        extra["max_param_diff"] = max_param_diff(run.module, run.ref.model)
    diff = extra.get("max_param_diff", math.nan)
    mine = torch.tensor([share, mine_sum, step_ms, comm_ms, diff], dtype=torch.float64)
    everyone = [torch.empty_like(mine) for _ in range(run.quorum.world_size)]
    entry = {"step": step, "quorum": run.quorum.id, "world": run.quorum.world_size}
    run.history.append({**entry, "identical": None, "diff": None})
    timeout = run.cfg.collective_timeout_s
    wait_work(run.pg.allgather([everyone], [mine]), run.member, timeout, f"check of step {step}")
    g = torch.stack(everyone)
    sums = g[:, 1].tolist()
    ref_diff = float(g[0, 4])
    run.history[-1].update(
        identical=len(set(sums)) == 1, diff=None if math.isnan(ref_diff) else ref_diff
    )
    loss = float(g[:, 0].sum())
    num_buckets = run.model.num_buckets
    run.jlog.write(
        StepRecord(
            run.replica, step, loss, mine_sum, step_ms, comm_ms, wall0,
            num_buckets=num_buckets, **extra,
        )
    )  # fmt: skip
    if run.group_rank == 0:
        row = StepRow(step, loss, sums, step_ms=float(g[:, 2].max()), comm_ms=float(g[:, 3].max()))
        row.ref_loss, row.ref_checksum = extra.get("ref_loss"), extra.get("ref_checksum")
        row.max_param_diff = extra.get("max_param_diff")
        log.info(f"{row.format()}   q{run.quorum.id} world {run.quorum.world_size}")
