"""One rank's training loop, shared by ``python -m ddp`` (spawned ranks), ``python -m ddp train``
(one externally launched rank, e.g. a container) and torchrun (env://).

Per step: the timed part (forward, backward with gradient sync, optimizer step), then an
untimed part: rank 0 advances the single-process reference on the global batch, and all ranks
gather (loss, checksum) so rank 0 can check the replicas. That gather also lines the ranks up,
so the next step's timer starts together everywhere and rank 0's reference work does not show
up as communication wait on the others.
"""

from __future__ import annotations

import gc
import importlib
import logging
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ddp.flight.diagnosis import PeerFailure, explain_failure
from ddp.flight.recorder import FlightRecorder
from ddp.program.config import Rendezvous, TrainConfig
from ddp.program.data import ShardSampler, make_dataset
from ddp.program.models import build_model
from ddp.program.parity import HEADER, ParityReport, StepRow, compression_of
from ddp.program.records import (
    ConfigRecord,
    EndRecord,
    FailureRecord,
    RecordLog,
    StepRecord,
    VerdictRecord,
)
from ddp.program.reference import Reference, checksum, max_param_diff, params_sha256, sgd
from ddp.program.rendezvous import NeverJoined, join
from ddp.program.resume import NothingToResume, agreed_start, restore, save
from ddp.wrapper.comm_hooks import register_named_hook
from ddp.wrapper.distributed import DistributedDataParallel

__all__ = ["NothingToResume", "PeerFailure", "run_rank"]

log = logging.getLogger("ddp")


def _flight_dir(cfg: TrainConfig, rdzv: Rendezvous) -> Path | None:
    """Where flight-recorder dumps go: somewhere every rank can read. The log directory, or
    else the directory of a file:// rendezvous (shared by definition)."""
    if cfg.log_dir:
        return Path(cfg.log_dir) / "flight"
    if rdzv.init_method.startswith("file://"):
        return Path(rdzv.init_method[len("file://") :]).parent / "flight"
    return None


def run_rank(cfg: TrainConfig, rdzv: Rendezvous) -> bool:
    """Train one rank to the end; returns the parity verdict, which every rank agrees on.

    Raises ``PeerFailure`` (with the diagnosis as message) when a collective fails because
    another rank died, stalled or was cut off, or when a rank never joined (``NeverJoined``).
    """
    # torch.optim imports torch._dynamo lazily; imported while a group exists, it keeps a C++
    # reference to the group past destroy_process_group(), and gloo's threads then run into
    # interpreter shutdown (the bench's rare SIGABRT). Imported before the group, it takes none.
    importlib.import_module("torch._dynamo")
    jlog = RecordLog(cfg.log_dir, rdzv.rank, echo=cfg.emit_records)
    try:
        store = join(rdzv, cfg.collective_timeout_s)
    except NeverJoined as e:
        jlog.write(FailureRecord(rdzv.rank, str(e), e.missing_ranks))
        jlog.close()
        raise
    rendezvous = {"store": store} if store is not None else {"init_method": rdzv.init_method}
    dist.init_process_group(
        "gloo",
        rank=rdzv.rank,
        world_size=rdzv.world_size,
        timeout=timedelta(seconds=cfg.collective_timeout_s),
        **rendezvous,
    )
    started = time.time()
    recorder = FlightRecorder(rdzv.rank, rdzv.world_size)
    flight = _flight_dir(cfg, rdzv)
    if flight is not None:
        # Answers other ranks' dump requests even while this rank is blocked in a collective.
        recorder.watch(flight)
    try:
        try:
            holds = _train(cfg, rdzv.rank, rdzv.world_size, jlog, recorder)
        except RuntimeError as e:
            if all(r.state == "completed" for r in recorder.records()):
                raise  # not a communication failure (e.g. unused parameters): as it is
            failure = explain_failure(e, recorder, flight, newer_than=started)
            jlog.write(FailureRecord(rdzv.rank, str(failure), failure.missing_ranks))
            raise failure from e
        if flight is not None:
            recorder.dump(flight, "exit")
        return holds
    finally:
        recorder.stop_watching()
        jlog.close()
        # The wrapper's hooks form reference cycles that hold the group: free them first.
        gc.collect()
        dist.destroy_process_group()


def _simulate_backward_compute(module: nn.Module, total_ms: float) -> None:
    """Make backward take ``total_ms`` longer, spread evenly over the parameters' gradients.

    A stand-in for accelerator compute, which does not occupy the host's CPU: each gradient
    hook sleeps (releasing the GIL) before the gradient is accumulated, so buckets still fill
    one by one during backward and their allreduces can run behind the remaining "compute".
    On a CPU-only host where 4 ranks share 2 cores, real backward compute competes with gloo
    and the packet delayer for the same cores, and overlap cannot show.
    """
    params = [p for p in module.parameters() if p.requires_grad]
    each_s = total_ms / 1e3 / max(1, len(params))

    def compute(grad: torch.Tensor) -> torch.Tensor:
        time.sleep(each_s)
        return grad

    for p in params:
        p.register_hook(compute)


def _train(
    cfg: TrainConfig, rank: int, world: int, jlog: RecordLog, recorder: FlightRecorder
) -> bool:
    torch.set_num_threads(1)  # ranks share the host's cores; intra-op threads would fight
    x, y = make_dataset(cfg.seed)
    sampler = ShardSampler(len(x), rank, world, cfg.local_batch(world), cfg.seed)
    module = build_model(cfg.model, cfg.seed)
    opt = sgd(module, cfg)
    ref = Reference(cfg, world, len(x)) if rank == 0 and cfg.reference else None
    resumed = agreed_start(cfg, rank, recorder)
    bucket_order = None if resumed is None else restore(cfg, resumed, module, opt, ref)
    start = resumed or 0
    if cfg.backward_delay_ms:
        _simulate_backward_compute(module, cfg.backward_delay_ms)
    if cfg.sync == "allreduce":
        model: nn.Module = DistributedDataParallel(
            module,
            bucket_cap_mb=cfg.bucket_cap_mb,
            overlap=cfg.overlap,
            find_unused_parameters=cfg.model == "branchy",
            flight_recorder=recorder,
        )
        if cfg.comm_hook != "none":
            register_named_hook(model, cfg.comm_hook)
        if bucket_order is not None:
            model.restore_bucket_order(bucket_order)
    else:
        model = module  # --sync barrier / none: same loop, no gradient averaging
    ddp = model if isinstance(model, DistributedDataParallel) else None
    buckets = ddp.num_buckets if ddp else 0
    shapes = ddp.bucket_shapes if ddp else None
    config = ConfigRecord(rank, world, buckets, start, cfg.to_dict(), os.getpid(), shapes)
    jlog.write(config)
    if ddp is not None:
        log.info(
            f"{world} ranks, model {cfg.model}, {_buckets_text(ddp)} "
            f"(cap {cfg.bucket_cap_mb} MB), overlap {'on' if cfg.overlap else 'off'}, "
            f"global batch {cfg.batch_size}"
            + (f", comm hook {cfg.comm_hook}" if cfg.comm_hook != "none" else "")
        )
    else:
        how = "dist.barrier() only" if cfg.sync == "barrier" else "nothing (local SGD)"
        log.info(f"{world} ranks, model {cfg.model}, sync by {how}, no allreduce")
    log.info(HEADER)

    rows = []
    for step in range(start + 1, cfg.steps + 1):
        if ddp is not None:
            ddp.wrapper.reducer.step = step
        idx = sampler.indices(step - 1)
        if ref is not None and cfg.comm_hook == "none":
            ref.anchor(module, opt)  # judge this step alone (see ddp.program.reference)
        wall0, t0 = time.time(), time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_t = F.cross_entropy(model(x[idx]), y[idx])
        if cfg.step_delay_ms:
            time.sleep(cfg.step_delay_ms / 1e3)
        t_bw = time.perf_counter()
        loss_t.backward()
        timeline: dict[str, object] = {}
        comm_s = 0.0
        if ddp is not None:
            comm_s = ddp.last_comm_wait_s
            tl = ddp.wrapper.reducer.last_timeline
            timeline = {
                "backward_ms": [(t_bw - t0) * 1e3, (tl["backward_end"] - t0) * 1e3],
                "buckets_ms": [[(a - t0) * 1e3, (b - t0) * 1e3] for a, b in tl["buckets"]],
                "num_buckets": ddp.num_buckets,
            }
        elif cfg.sync == "barrier":
            tb = time.perf_counter()
            with recorder.record("barrier", step=step):
                dist.barrier()
            comm_s = time.perf_counter() - tb
        opt.step()
        step_ms = (time.perf_counter() - t0) * 1e3
        loss = loss_t.item()

        mine_sum = checksum(module)
        extra = {}
        if ref is not None:
            extra["ref_loss"] = ref.step(x, y, step - 1)
            extra["ref_checksum"] = checksum(ref.model)
            extra["max_param_diff"] = max_param_diff(module, ref.model)
        mine = torch.tensor([loss, mine_sum, step_ms, comm_s * 1e3], dtype=torch.float64)
        everyone = [torch.empty_like(mine) for _ in range(world)]
        with recorder.record("all_gather", step=step, nbytes=mine.numel() * 8 * world):
            dist.all_gather(everyone, mine)
        jlog.write(
            StepRecord(
                rank, step, loss, mine_sum, step_ms, comm_s * 1e3, wall0, **timeline, **extra
            )
        )
        if rank != 0:  # shown only with --log-all-ranks
            log.info(f"step {step}  loss {loss:.4f}  {step_ms:.1f} ms  comm {comm_s * 1e3:.1f} ms")
        else:
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
            every = cfg.checkpoint_every
            if every and (step % every == 0 or step == cfg.steps):
                # Before the row: whoever sees step K reported may rely on checkpoint K.
                save(cfg, step, module, opt, ref, ddp.bucket_order if ddp else None)
            log.info(row.format())

    holds = torch.zeros(1, dtype=torch.int64)
    if rank == 0:
        report = ParityReport(
            rows, world, cfg.tolerance, expected_steps=cfg.steps - start,
            compression=compression_of(cfg.to_dict()),
        )  # fmt: skip
        if cfg.sync == "barrier" and not report.holds:
            log.info("dist.barrier() lines the ranks up in time but never exchanges gradients:")
            log.info("each replica followed its own shard's gradients.")
        log.info(report.verdict)
        jlog.write(VerdictRecord(rank, report.holds, report.verdict))
        holds[0] = int(report.holds)
    with recorder.record("broadcast", step=cfg.steps):
        dist.broadcast(holds, group_src=0)  # every rank exits with rank 0's verdict
    # Tear down only once every rank is done: a rank that destroys its gloo pairs while a
    # peer's last message is still in flight can abort that peer (seen once in 9 container
    # runs: "terminate called without an active exception" after the verdict).
    with recorder.record("barrier", step=cfg.steps):
        dist.barrier()
    jlog.write(EndRecord(rank, bool(holds.item()), params_sha256(module)))
    return bool(holds.item())


def _buckets_text(ddp: DistributedDataParallel) -> str:
    n = ddp.num_buckets
    text = f"{n} bucket{'s' if n != 1 else ''}"
    if ddp.wrapper.reducer.rebuild_pending:
        text += " for step 1, then rebuilt in gradient-ready order"
    return text
