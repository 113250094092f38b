"""One rank's training loop, nanoGPT-style: ``_setup`` builds the run, ``_step`` runs one
step, ``_verify`` gives the parity verdict every rank exits with.

Per step: the timed part (forward, backward with gradient sync, optimizer step), then an
untimed part: rank 0 advances the single-process reference on the global batch, and all ranks
gather (loss, checksum) so rank 0 can check the replicas. That gather also lines the ranks up,
so the next step's timer starts together everywhere and rank 0's reference work does not show
up as communication wait on the others.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ddp.flight.recorder import FlightRecorder
from ddp.program.config import TrainConfig
from ddp.program.data import ShardSampler, make_dataset
from ddp.program.memory import optimizer_state_bytes, peak_rss_mib
from ddp.program.models import build_model, simulate_backward_compute
from ddp.program.optimizer import build_optimizer, full_state_dict, shard
from ddp.program.parity import HEADER, ParityReport, StepRow, compression_of
from ddp.program.records import (
    ConfigRecord,
    EndRecord,
    PlanRecord,
    RecordLog,
    StepRecord,
    VerdictRecord,
)
from ddp.program.reference import Reference, checksum, max_param_diff, params_sha256
from ddp.program.resume import agreed_start, restore, save
from ddp.program.wrap import bucket_count, start_line, wrap
from ddp.wrapper.auto_cap import MAX_BYTES_PER_S
from ddp.wrapper.comm_auto import AutoComm
from ddp.wrapper.distributed import DistributedDataParallel

__all__ = ["train"]

log = logging.getLogger("ddp")


@dataclass
class _Run:
    """One rank's run: what ``_setup`` builds and every ``_step`` uses."""

    cfg: TrainConfig
    rank: int
    world: int
    jlog: RecordLog
    recorder: FlightRecorder
    x: torch.Tensor  # the whole data set; each step samples this rank's shard of it
    y: torch.Tensor
    sampler: ShardSampler
    module: nn.Module  # the bare model (what the optimizer, reference and checksums see)
    model: nn.Module  # what forward runs: the wrapper, or the module itself (no --sync allreduce)
    ddp: DistributedDataParallel | None
    opt: torch.optim.Optimizer
    ref: Reference | None  # rank 0's single-process reference on the global batch
    start: int  # the last step already done (0, or the step a resumed run continues after)
    rows: list[StepRow] = field(default_factory=list)  # rank 0's parity rows
    planner: AutoComm | None = None  # --comm auto's (ours: the wrapper's; torch's: wrap's)
    auto_cap_reported: bool = False


def train(
    cfg: TrainConfig, rank: int, world: int, jlog: RecordLog, recorder: FlightRecorder
) -> bool:
    """Train this rank from its start (step 0, or a checkpoint's) to ``cfg.steps``, writing its
    records to ``jlog``; returns rank 0's parity verdict, which every rank agrees on."""
    run = _setup(cfg, rank, world, jlog, recorder)
    for step in range(run.start + 1, cfg.steps + 1):
        _step(run, step)
    return _verify(run)


def _setup(
    cfg: TrainConfig, rank: int, world: int, jlog: RecordLog, recorder: FlightRecorder
) -> _Run:
    """Data, model, optimizer, reference, the checkpoint to resume from, the wrapper; then the
    config record and the run's first log lines."""
    torch.set_num_threads(1)  # ranks share the host's cores; intra-op threads would fight
    x, y = make_dataset(cfg.seed)
    sampler = ShardSampler(len(x), rank, world, cfg.local_batch(world), cfg.seed)
    module = build_model(cfg.model, cfg.seed)
    opt = build_optimizer(module, cfg, sharded=True)
    ref = Reference(cfg, world, len(x)) if rank == 0 and cfg.reference else None
    start = agreed_start(cfg, rank, recorder, module, opt)
    bucket_order = None if start is None else restore(cfg, start, module, opt, ref, recorder)
    if cfg.backward_delay_ms:
        simulate_backward_compute(module, cfg.backward_delay_ms)
    model, hook_state = wrap(cfg, module, recorder, bucket_order)
    ddp = model if isinstance(model, DistributedDataParallel) else None
    if ddp is not None and cfg.shard_optimizer:  # ZeRO-1 on our buckets: 1/N of the state
        opt = shard(ddp, cfg, opt)
    run = _Run(
        cfg,
        rank,
        world,
        jlog,
        recorder,
        x,
        y,
        sampler,
        module,
        model,
        ddp,
        opt,
        ref,
        0 if start is None else start.step,
    )
    run.planner = ddp.auto_comm if ddp else hook_state if isinstance(hook_state, AutoComm) else None
    shapes = ddp.reducer.bucket_shapes if ddp else None
    buckets = bucket_count(cfg, model)
    jlog.write(ConfigRecord(rank, world, buckets, run.start, cfg.to_dict(), os.getpid(), shapes))
    log.info(start_line(cfg, world, model, hook_state))
    log.info(HEADER)
    return run


def _step(run: _Run, step: int) -> None:
    """One training step: the timed part (forward, backward with gradient sync, optimizer
    step), then the untimed part (``_check_step``)."""
    cfg, opt = run.cfg, run.opt
    if run.ddp is not None:
        run.ddp.reducer.step = step
    if cfg.reference and compression_of(cfg.to_dict()) is None:
        opt_state = full_state_dict(opt)  # sharded: a collective, the whole state on rank 0
        if run.ref is not None:  # judge this step alone (see ddp.program.reference)
            run.ref.anchor(run.module, opt_state)
    wall0, t0 = time.time(), time.perf_counter()
    opt.zero_grad(set_to_none=True)
    losses, k = [], cfg.accumulate
    for micro in range(k):
        idx = run.sampler.indices((step - 1) * k + micro)
        last = micro == k - 1
        # forward and backward both under no_sync: the forward tells the wrapper whether the
        # coming backward reduces (torch's require_backward_grad_sync)
        with contextlib.nullcontext() if last or run.module is run.model else run.model.no_sync():
            loss_t = F.cross_entropy(run.model(run.x[idx]), run.y[idx])
            if cfg.step_delay_ms and last:
                time.sleep(cfg.step_delay_ms / 1e3)
            t_bw = time.perf_counter()
            # 1/K per micro-batch: the sum of K micro-batch means is K times the step's mean
            (loss_t / k if k > 1 else loss_t).backward()
        losses.append(loss_t.item())
    comm_s, timeline = _communication(run, step, t0, t_bw)
    if run.planner is not None:
        _report_plans(run)
    opt.step()
    step_ms = (time.perf_counter() - t0) * 1e3
    _check_step(run, step, sum(losses) / k, step_ms, comm_s, wall0, timeline)


def _communication(run: _Run, step: int, t0: float, t_bw: float) -> tuple[float, dict[str, object]]:
    """Seconds this step's backward spent blocked on communication, and the wrapper's timeline
    of it (ms since the step's start: backward, and each bucket's launch and completion)."""
    if run.ddp is not None:
        comm_s = run.ddp.reducer.last_comm_wait_s
        tl = run.ddp.reducer.last_timeline
        timeline = {
            "backward_ms": [(t_bw - t0) * 1e3, (tl["backward_end"] - t0) * 1e3],
            "buckets_ms": [[(a - t0) * 1e3, (b - t0) * 1e3] for a, b in tl["buckets"]],
            "num_buckets": run.ddp.num_buckets,
        }
        if run.ddp.auto_cap is not None and not run.auto_cap_reported:
            run.auto_cap_reported = True
            timeline["auto_cap"] = run.ddp.auto_cap.summary()
            log.info(_auto_cap_line(timeline["auto_cap"], run.ddp.num_buckets))
        return comm_s, timeline
    if run.model is not run.module:  # torch's wrapper: its wait is inside its own backward
        return math.nan, {}
    if run.cfg.sync == "barrier":
        tb = time.perf_counter()
        with run.recorder.record("barrier", step=step):
            dist.barrier()
        return time.perf_counter() - tb, {}
    return 0.0, {}


def _check_step(
    run: _Run,
    step: int,
    loss: float,
    step_ms: float,
    comm_s: float,
    wall0: float,
    timeline: dict[str, object],
) -> None:
    """The untimed part of a step: rank 0 advances the reference on the global batch, every
    rank writes its step record, and all gather (loss, checksum, times) so rank 0 can compare
    the replicas, report the step and checkpoint it."""
    mine_sum = checksum(run.module)
    extra = {}
    if run.ref is not None:
        extra["ref_loss"] = run.ref.step(run.x, run.y, step - 1)
        extra["ref_checksum"] = checksum(run.ref.model)
        extra["max_param_diff"] = max_param_diff(run.module, run.ref.model)
    mine = torch.tensor([loss, mine_sum, step_ms, comm_s * 1e3], dtype=torch.float64)
    everyone = [torch.empty_like(mine) for _ in range(run.world)]
    with run.recorder.record("all_gather", step=step, nbytes=mine.numel() * 8 * run.world):
        dist.all_gather(everyone, mine)
    memory = {
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "optimizer_state_bytes": optimizer_state_bytes(run.opt),
    }
    every = run.cfg.checkpoint_every
    opt_state = None
    if every and (step % every == 0 or step == run.cfg.steps):
        opt_state = full_state_dict(run.opt)  # sharded: a collective, the whole on rank 0
    run.jlog.write(
        StepRecord(
            run.rank,
            step,
            loss,
            mine_sum,
            step_ms,
            comm_s * 1e3,
            wall0,
            **timeline,
            **extra,
            **memory,
        )
    )
    if run.rank != 0:  # shown only with --log-all-ranks
        log.info(f"step {step}  loss {loss:.4f}  {step_ms:.1f} ms  comm {comm_s * 1e3:.1f} ms")
        return
    g = torch.stack(everyone)
    row = StepRow(
        step=step,
        loss=float(g[:, 0].mean()),
        checksums=g[:, 1].tolist(),
        step_ms=float(g[:, 2].max()),
        comm_ms=float(g[:, 3].max()),
        **extra,
    )
    run.rows.append(row)
    if opt_state is not None:
        # Before the row: whoever sees step K reported may rely on checkpoint K.
        order = run.ddp.bucket_order if run.ddp else None
        save(run.cfg, step, run.module, run.opt, run.ref, order, opt_state)
    log.info(row.format())


def _verify(run: _Run) -> bool:
    """Rank 0's parity verdict over the steps run, which every rank then exits with."""
    cfg, rank = run.cfg, run.rank
    holds = torch.zeros(1, dtype=torch.int64)
    if rank == 0:
        report = ParityReport(
            run.rows,
            run.world,
            cfg.tolerance,
            expected_steps=cfg.steps - run.start,
            compression=compression_of(cfg.to_dict()),
        )
        if cfg.sync == "barrier" and not report.holds:
            log.info("dist.barrier() lines the ranks up in time but never exchanges gradients:")
            log.info("each replica followed its own shard's gradients.")
        log.info(report.verdict)
        run.jlog.write(VerdictRecord(rank, report.holds, report.verdict))
        holds[0] = int(report.holds)
    with run.recorder.record("broadcast", step=cfg.steps):
        dist.broadcast(holds, group_src=0)  # every rank exits with rank 0's verdict
    # Tear down only once every rank is done: a rank that destroys its gloo pairs while a
    # peer's last message is still in flight can abort that peer (seen once in 9 container
    # runs: "terminate called without an active exception" after the verdict).
    with run.recorder.record("barrier", step=cfg.steps):
        dist.barrier()
    run.jlog.write(EndRecord(rank, bool(holds.item()), params_sha256(run.module)))
    return bool(holds.item())


def _report_plans(run: _Run) -> None:
    """``--comm auto``'s decisions since the last step: one record each, and a line."""
    assert run.planner is not None
    for rec in run.planner.take_records():
        run.jlog.write(PlanRecord(run.rank, **rec))
        was = rec.get("previous_measured_ms")
        if rec["changed"]:
            text = f"comm auto, from step {rec['step']}: {rec['cap_mb']} MB {rec['algorithm']}, "
            text += f"predicted {rec['predicted_ms']} ms"
            text += f" (the plan before measured {was} ms)" if was is not None else ""
        else:
            text = f"comm auto, step {rec['step']}: kept {rec['cap_mb']} MB {rec['algorithm']}, "
            text += f"predicted {rec['predicted_ms']} ms, measured {rec['measured_ms']} ms"
        log.info(f"{text}; {rec['reason']}")


def _auto_cap_line(chosen: dict[str, object], buckets: int) -> str:
    mb_per_s = chosen["link_mb_per_s"]
    if mb_per_s >= round(MAX_BYTES_PER_S / (1 << 20), 3):  # type: ignore[operator]
        # fit_link's clamp: the probe's times did not grow with its sizes
        rate = "bytes free (the probe's time did not grow with size: too fast to measure)"
    else:
        rate = f"bytes at {mb_per_s} MB/s"
    return (
        f"auto bucket cap: {chosen['cap_mb']} MB ({buckets} bucket{'s' if buckets != 1 else ''}), "
        f"link fit {chosen['link_latency_ms']} ms + {rate}, "
        f"{chosen.get('call_cpu_ms', 0.0)} ms CPU per call, probed in "
        f"{chosen['probe_ms']} ms; predicted communication end per cap (ms): "
        + ", ".join(f"{c} {t}" for c, t in chosen["predicted_ms"].items())  # type: ignore[union-attr]
    )
