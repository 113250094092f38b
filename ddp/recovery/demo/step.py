"""One step of the demo program's live run, through ``ddp.recovery.api`` like any loop: enter the
quorum, forward and backward on this rank's shard of the global batch (``batch_slice``), the
commit vote, the optimizer step only if it passed, then this step's checksum (and the
reference, on group rank 0).

The replica check rides on the vote: every member adds the previous step's figures (loss
share, checksum, times, the reference's difference) to its vote row (``should_commit``'s
``report``), so a live step issues as many collectives as a step of the restart mode (the
gradient allreduce and one gather). The check of a run's last step is one exchange more
(``finish_check``); a check that a fault cut short is done by the next quorum's heal exchange
(``Manager.last_heal.identical``).
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

from ddp.program.parity import HEADER, StepRow
from ddp.program.records import StepRecord
from ddp.program.reference import Reference, checksum, max_param_diff
from ddp.recovery.api import Manager
from ddp.recovery.demo.job import ReplicaJob

__all__ = ["LiveRun", "finish_check", "run_step"]

log = logging.getLogger("ddp")


@dataclass
class LiveRun(ReplicaJob):
    """One rank's live run: what it trains, and what it checks."""

    manager: Manager | None = None
    model: Any = None  # the wrapper, built once; the manager averages its gradients
    ref: Reference | None = None  # group rank 0's single-process reference
    history: list[dict] = field(default_factory=list)
    pending: dict | None = None  # the last step's figures, until the next gather checks them
    quorums_seen: int = 0

    def state_dict(self) -> dict:
        """What a member that is behind receives: weights, optimizer state, and the per-step
        history (a healed rank accounts for the steps it did not run itself)."""
        self.keep_pending()
        return {
            "model": self.module.state_dict(),
            "optim": self.opt.state_dict(),
            "history": self.history,
        }

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optim"])
        self.history = list(state["history"])

    def keep_pending(self) -> None:
        """The last step's check will not be gathered in this quorum: the next quorum's heal
        exchange compares the replicas; what this rank knows alone (the reference's
        difference, on the rank that holds it) goes into its history now."""
        if self.pending is not None:
            diff = self.pending["diff"]
            for entry in reversed(self.history):
                if entry["step"] == self.pending["step"]:
                    entry["diff"] = None if math.isnan(diff) else diff
                    break
        self.pending = None


_COLUMNS = 5  # the previous step's: share, checksum, ms, comm ms, diff


def _report(run: LiveRun) -> list[float]:
    p = run.pending
    return (
        [p["share"], p["checksum"], p["step_ms"], p["comm_ms"], p["diff"]]
        if p
        else [math.nan] * _COLUMNS
    )


def _entered(run: LiveRun) -> None:
    """After a quorum was entered: the check the fault cut short, the reference's holder."""
    m, cfg = run.manager, run.cfg
    run.quorums_seen = m.quorums
    h = m.last_heal
    last = run.history[-1] if run.history else None
    if last is not None and last["identical"] is None and last["step"] == h.step:
        last["identical"] = h.identical  # the check cut short by the fault, done here
    if m.group_rank == 0 and cfg.reference:
        run.ref = run.ref or Reference(cfg, 1, len(run.x))
    else:
        run.ref = None
    q = m.quorum
    if m.group_rank == 0:
        log.info(f"quorum {q.id}: ranks {q.replicas} (world {q.world_size}; {q.reason})")
        if m.quorums == 1:
            log.info(HEADER)


def _reference_step(run: LiveRun, step: int) -> float:
    """The reference's step on the whole global batch of ``step`` (all micro-batches)."""
    k, ref = run.cfg.accumulate, run.ref
    idx = torch.cat([run.batches.indices((step - 1) * k + j) for j in range(k)])
    ref.opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(ref.model(run.x[idx]), run.y[idx])
    loss.backward()
    ref.opt.step()
    return loss.item()


def run_step(run: LiveRun) -> None:
    """One attempt at the next step; a failed one leaves the weights untouched."""
    cfg, model, m = run.cfg, run.model, run.manager
    m.start_quorum()
    if m.quorums != run.quorums_seen:
        _entered(run)
    step = m.attempting
    if run.ref is not None:
        run.ref.anchor(run.module, run.opt.state_dict())
    wall0, t0 = time.time(), time.perf_counter()
    run.opt.zero_grad(set_to_none=True)
    k, share = cfg.accumulate, 0.0
    for micro in range(k):
        idx = run.batches.indices((step - 1) * k + micro)
        idx = idx[m.batch_slice(len(idx))]
        last = micro == k - 1
        with contextlib.nullcontext() if last else model.no_sync():
            loss_t = F.cross_entropy(model(run.x[idx]), run.y[idx])
            if cfg.step_delay_ms and last:
                time.sleep(cfg.step_delay_ms / 1e3)
            (loss_t / k if k > 1 else loss_t).backward()
        share += loss_t.item() * len(idx) / cfg.batch_size / k
    comm_ms = model.reducer.last_comm_wait_s * 1e3
    p = run.pending
    if not m.should_commit(_report(run)):
        return
    run.opt.step()  # committed: from here on this step counts
    step_ms = (time.perf_counter() - t0) * 1e3
    if p is not None:
        run.pending = None
        _record_check(run, p, m.reports)
    q = m.quorum
    run.history.append({"step": step, "quorum": q.id, "world": q.world_size, "identical": None})
    run.history[-1]["diff"] = None
    _pending(run, step, share, step_ms, comm_ms, wall0)


def finish_check(run: LiveRun) -> None:
    """The check of the last step (an exchange without a step to vote on)."""
    p = run.pending
    if p is not None and run.manager.quorums == run.quorums_seen:
        g = run.manager.exchange(_report(run))
        if g is not None:
            run.pending = None
            _record_check(run, p, g)


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
    sums = g[:, 1].tolist()
    ref_diff, loss = float(g[0, 4]), float(g[:, 0].sum())
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
    m = run.manager
    if m.group_rank == 0:
        row = StepRow(p["step"], loss, sums, step_ms=float(g[:, 2].max()))
        row.comm_ms = float(g[:, 3].max())
        row.ref_loss, row.ref_checksum = extra.get("ref_loss"), extra.get("ref_checksum")
        row.max_param_diff = extra.get("max_param_diff")
        log.info(f"{row.format()}   q{m.quorum.id} world {m.quorum.world_size}")
