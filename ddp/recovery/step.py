"""One step of a live run: forward and backward on this rank's shard of the global batch
(gradients averaged by the wrapper, every wait interruptible), the commit vote, the optimizer
step only if the vote passed, then this step's checksum (and the reference, on group rank 0).

The commit vote is one all-gather of ``[no, newest quorum id heard of, the previous step's
check]`` before ``opt.step()``. A member that failed never gets there, and its peers' vote then
fails too, so no member applies a step another could not. The second entry makes every member
agree at the same step boundary to move to a quorum the coordinator formed for ranks that
joined. The rest is the replica check of the step before (loss share, checksum, times, the
reference's difference): riding on the vote, a live step issues as many collectives as a step
of the restart mode (the gradient allreduce and one gather), so the vote costs almost nothing.
The check of a run's last step is one gather more (``finish_check``); a check that a fault cut
short is done by the next quorum's heal exchange (``ddp.recovery.heal``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from ddp.program.parity import StepRow
from ddp.program.records import StepRecord
from ddp.program.reference import Reference, checksum, max_param_diff, params_sha256
from ddp.recovery.failpoints import failpoint
from ddp.recovery.job import ReplicaJob
from ddp.recovery.member import Member
from ddp.recovery.protocol import Quorum
from ddp.recovery.records import CommitRecord
from ddp.recovery.waiting import QuorumLost, wait_work
from ddp.wrapper.distributed import DistributedDataParallel

__all__ = ["LiveRun", "finish_check", "run_step"]

log = logging.getLogger("ddp")


@dataclass
class LiveRun(ReplicaJob):
    """One rank's live run: what it trains, and where it stands in the protocol."""

    member: Member | None = None
    step: int = 0  # the last step committed
    attempting: int | None = None  # the step under way, until it commits
    quorum: Quorum | None = None
    agreed: int = 0  # the newest quorum id every member of the current one knows of
    group_rank: int = 0
    pg: Any = None
    model: DistributedDataParallel | None = None
    ref: Reference | None = None  # group rank 0's single-process reference
    history: list[dict] = field(default_factory=list)
    pending: dict | None = None  # the last step's figures, until the next gather checks them
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


_COLUMNS = 7  # no, newest quorum id, then the previous step's: share, checksum, ms, comm, diff


def _gather(run: LiveRun, what: str) -> torch.Tensor | None:
    """The vote-and-check gather: every member's row, or None when nothing was pending."""
    p = run.pending
    prev = [p["share"], p["checksum"], p["step_ms"], p["comm_ms"], p["diff"]] if p else []
    mine = torch.tensor([0, run.member.latest, *prev], dtype=torch.float64)
    mine = torch.cat([mine, torch.full((_COLUMNS - len(mine),), math.nan, dtype=torch.float64)])
    everyone = [torch.empty_like(mine) for _ in range(run.quorum.world_size)]
    timeout = run.cfg.collective_timeout_s
    wait_work(run.pg.allgather([everyone], [mine]), run.member, timeout, what)
    g = torch.stack(everyone)
    # Only what every member gathered decides a switch: the watcher may hear of a new quorum
    # between two gathers on one member and not on another.
    run.agreed = max(run.agreed, int(g[:, 1].max()))
    if p is not None:
        run.pending = None
        _record_check(run, p, g)
    return g


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
    g = _gather(run, f"commit vote of step {step}")
    if bool((g[:, 0] != 0).any()):
        raise QuorumLost(f"a member voted against step {step}", "self")
    failpoint("step.voted", step=step)
    run.opt.step()  # committed: from here on this step counts
    run.step, run.attempting = step, None
    step_ms = (time.perf_counter() - t0) * 1e3
    q = run.quorum
    digest = params_sha256(run.module) if cfg.commit_digests else None
    run.jlog.write(CommitRecord(run.replica, step, q.id, world, True, time.time(), "", digest))
    run.history.append({"step": step, "quorum": q.id, "world": world, "identical": None})
    run.history[-1]["diff"] = None
    _pending(run, step, share, step_ms, comm_ms, wall0)


def finish_check(run: LiveRun) -> None:
    """The check of the last step (a gather without a step to vote on)."""
    if run.pending is not None and run.model is not None:
        _gather(run, f"check of step {run.pending['step']}")


def _pending(run: LiveRun, step: int, share: float, step_ms: float, comm_ms: float, wall0: float):
    """This step's figures, checked in the next gather; the reference's step on group rank 0."""
    extra = {}
    if run.ref is not None:
        extra["ref_loss"] = _reference_step(run, step)
        extra["ref_checksum"] = checksum(run.ref.model)
        extra["max_param_diff"] = max_param_diff(run.module, run.ref.model)
    run.pending = {
        "step": step,
        "share": share,
        "checksum": checksum(run.module),
        "step_ms": step_ms,
        "comm_ms": comm_ms,
        "diff": extra.get("max_param_diff", math.nan),
        "wall0": wall0,
        "extra": extra,
    }


def _record_check(run: LiveRun, p: dict, g: torch.Tensor) -> None:
    """Every member learns whether the replicas agreed after step ``p['step']``."""
    sums = g[:, 3].tolist()
    ref_diff, loss = float(g[0, 6]), float(g[:, 2].sum())
    entry = next(h for h in reversed(run.history) if h["step"] == p["step"])
    entry.update(identical=len(set(sums)) == 1, diff=None if math.isnan(ref_diff) else ref_diff)
    extra = p["extra"]
    run.jlog.write(
        StepRecord(
            run.replica,
            p["step"],
            loss,
            p["checksum"],
            p["step_ms"],
            p["comm_ms"],
            p["wall0"],
            num_buckets=run.model.num_buckets,
            **extra,
        )
    )
    if run.group_rank == 0:
        row = StepRow(p["step"], loss, sums, step_ms=float(g[:, 4].max()))
        row.comm_ms = float(g[:, 5].max())
        row.ref_loss, row.ref_checksum = extra.get("ref_loss"), extra.get("ref_checksum")
        row.max_param_diff = extra.get("max_param_diff")
        log.info(f"{row.format()}   q{run.quorum.id} world {run.quorum.world_size}")
