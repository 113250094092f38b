"""One rank's training loop, shared by ``python -m ddp`` (spawned ranks), ``python -m ddp train``
(one externally launched rank, e.g. a container) and torchrun (env://).

Per step: the timed part (forward, backward with gradient sync, optimizer step), then an
untimed part: rank 0 advances the single-process reference on the global batch, and all ranks
gather (loss, checksum) so rank 0 can check the replicas. That gather also lines the ranks up,
so the next step's timer starts together everywhere and rank 0's reference work does not show
up as communication wait on the others.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import IO

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ddp.config import Rendezvous, TrainConfig
from ddp.data import ShardSampler, global_batch, make_dataset
from ddp.distributed import DistributedDataParallel
from ddp.models import build_model
from ddp.parity import HEADER, ParityReport, StepRow

__all__ = ["run_rank", "setup_logging"]

log = logging.getLogger("ddp")


def setup_logging(rank: int, all_ranks: bool = False) -> None:
    """Rank 0 prints; the others only warn, unless ``all_ranks`` (then lines carry the rank)."""
    fmt = f"[rank{rank}] %(message)s" if all_ranks else "%(message)s"
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(fmt))
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.INFO if rank == 0 or all_ranks else logging.WARNING)


class _JsonLog:
    """``<log_dir>/rank<R>.jsonl``, flushed per line so a killed rank leaves what it did."""

    def __init__(self, log_dir: str | None, rank: int) -> None:
        self._f: IO[str] | None = None
        if log_dir:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            self._f = open(Path(log_dir) / f"rank{rank}.jsonl", "w")  # noqa: SIM115

    def write(self, **record: object) -> None:
        if self._f is not None:
            self._f.write(json.dumps(record) + "\n")
            self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()


@torch.no_grad()
def _checksum(module: nn.Module) -> float:
    return float(sum(p.detach().double().sum() for p in module.parameters()))


@torch.no_grad()
def _max_diff(a: nn.Module, b: nn.Module) -> float:
    return max(
        float((p - q).abs().max()) for p, q in zip(a.parameters(), b.parameters(), strict=True)
    )


def _sgd(module: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    return torch.optim.SGD(module.parameters(), lr=cfg.lr, momentum=cfg.momentum)


class _Reference:
    """The single-process run that DDP must equal: same init, same optimizer, global batch."""

    def __init__(self, cfg: TrainConfig, world_size: int, n: int) -> None:
        self.model = build_model(cfg.model, cfg.seed)
        self.opt = _sgd(self.model, cfg)
        lb = cfg.local_batch(world_size)
        self.samplers = [ShardSampler(n, r, world_size, lb, cfg.seed) for r in range(world_size)]

    def step(self, x: torch.Tensor, y: torch.Tensor, step: int) -> float:
        idx = global_batch(self.samplers, step)
        self.opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.model(x[idx]), y[idx])
        loss.backward()
        self.opt.step()
        return loss.item()


def run_rank(cfg: TrainConfig, rdzv: Rendezvous) -> bool:
    """Train one rank to the end; returns the parity verdict, which every rank agrees on."""
    dist.init_process_group(
        "gloo",
        init_method=rdzv.init_method,
        rank=rdzv.rank,
        world_size=rdzv.world_size,
        timeout=timedelta(seconds=cfg.timeout_s),
    )
    jlog = _JsonLog(cfg.log_dir, rdzv.rank)
    try:
        return _train(cfg, rdzv.rank, rdzv.world_size, jlog)
    finally:
        jlog.close()
        dist.destroy_process_group()


def _train(cfg: TrainConfig, rank: int, world: int, jlog: _JsonLog) -> bool:
    torch.set_num_threads(1)  # ranks share the host's cores; intra-op threads would fight
    x, y = make_dataset(cfg.seed)
    sampler = ShardSampler(len(x), rank, world, cfg.local_batch(world), cfg.seed)
    module = build_model(cfg.model, cfg.seed)
    if cfg.sync == "allreduce":
        model: nn.Module = DistributedDataParallel(
            module,
            bucket_cap_mb=cfg.bucket_cap_mb,
            overlap=cfg.overlap,
            find_unused_parameters=cfg.model == "branchy",
        )
    else:
        model = module  # --sync barrier / none: same loop, no gradient averaging
    opt = _sgd(module, cfg)
    ref = _Reference(cfg, world, len(x)) if rank == 0 and cfg.reference else None
    buckets = model.num_buckets if isinstance(model, DistributedDataParallel) else 0
    jlog.write(event="config", rank=rank, world_size=world, num_buckets=buckets, **cfg.to_dict())
    if isinstance(model, DistributedDataParallel):
        log.info(
            f"{world} ranks, model {cfg.model}, {model.num_buckets} buckets "
            f"(cap {cfg.bucket_cap_mb} MB), overlap {'on' if cfg.overlap else 'off'}, "
            f"global batch {cfg.batch_size}"
        )
    else:
        how = "dist.barrier() only" if cfg.sync == "barrier" else "nothing (local SGD)"
        log.info(f"{world} ranks, model {cfg.model}, sync by {how}, no allreduce")
    log.info(HEADER)

    rows = []
    for step in range(1, cfg.steps + 1):
        idx = sampler.indices(step - 1)
        wall0, t0 = time.time(), time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_t = F.cross_entropy(model(x[idx]), y[idx])
        t_bw = time.perf_counter()
        loss_t.backward()
        timeline: dict[str, object] = {}
        comm_s = 0.0
        if isinstance(model, DistributedDataParallel):
            comm_s = model.last_comm_wait_s
            tl = model.reducer.last_timeline
            timeline = {
                "backward_ms": [(t_bw - t0) * 1e3, (tl["backward_end"] - t0) * 1e3],
                "buckets_ms": [[(a - t0) * 1e3, (b - t0) * 1e3] for a, b in tl["buckets"]],
            }
        elif cfg.sync == "barrier":
            tb = time.perf_counter()
            dist.barrier()
            comm_s = time.perf_counter() - tb
        opt.step()
        step_ms = (time.perf_counter() - t0) * 1e3
        loss = loss_t.item()

        checksum = _checksum(module)
        extra = {}
        if ref is not None:
            extra["ref_loss"] = ref.step(x, y, step - 1)
            extra["ref_checksum"] = _checksum(ref.model)
            extra["max_param_diff"] = _max_diff(module, ref.model)
        mine = torch.tensor([loss, checksum, step_ms, comm_s * 1e3], dtype=torch.float64)
        everyone = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(everyone, mine)
        jlog.write(
            event="step",
            rank=rank,
            step=step,
            loss=loss,
            checksum=checksum,
            step_ms=step_ms,
            comm_ms=comm_s * 1e3,
            t0=wall0,
            **timeline,
            **extra,
        )
        if rank == 0:
            g = torch.stack(everyone)
            row = StepRow(
                step=step,
                loss=float(g[:, 0].mean()),
                checksums=g[:, 1].tolist(),
                step_ms=float(g[:, 2].max()),
                comm_ms=float(g[:, 3].max()),
                **extra,
            )
            rows.append(row)
            log.info(row.format())

    holds = torch.zeros(1, dtype=torch.int64)
    if rank == 0:
        report = ParityReport(rows, world, cfg.tolerance, expected_steps=cfg.steps)
        if cfg.sync == "barrier" and not report.holds:
            log.info("dist.barrier() lines the ranks up in time but never exchanges gradients:")
            log.info("each replica followed its own shard's gradients.")
        log.info(report.verdict)
        holds[0] = int(report.holds)
    dist.broadcast(holds, group_src=0)  # every rank exits with rank 0's verdict
    jlog.write(event="end", rank=rank, parity=bool(holds.item()))
    return bool(holds.item())
