"""One replica of a ``--recovery torchft`` run (``python -m ddp train --recovery torchft
--coordinator LIGHTHOUSE:PORT``): a replica group of one rank under torchft's ``Manager``.

A step, in torchft's order: ``start_quorum`` (synchronous here: the shard of the global batch
needs this replica's rank in the quorum before the forward, so an asynchronous quorum would
be waited for at once anyway; a replica that is behind is healed inside it), forward and
backward (each bucket averaged by the manager through the comm hook), ``should_commit``, and
the optimizer step only if it says yes. A step that did not commit is redone in the next
quorum with the same step number, as ``--recovery live`` does.
"""

from __future__ import annotations

import contextlib
import socket
import time
from datetime import timedelta

import torch.distributed as dist
import torch.nn.functional as F
from torchft.manager import Manager

from ddp.flight.gloo_errors import error_meaning
from ddp.program.config import TrainConfig
from ddp.program.records import EndRecord, RecordLog, StepRecord
from ddp.program.reference import checksum, params_sha256
from ddp.recovery.demo.job import job_parts
from ddp.recovery.demo.torchft.lighthouse import wait_for_replicas
from ddp.recovery.demo.torchft.replica import (
    Replica,
    WatchedGloo,
    WatchedTransport,
    manager_allreduce_hook,
)
from ddp.recovery.demo.torchft.verdict import judge_history
from ddp.recovery.records import CommitRecord, FaultRecord, RecoveryVerdictRecord
from ddp.wrapper.distributed import DistributedDataParallel

__all__ = ["train_torchft"]


def _local_group() -> dist.ProcessGroup:
    """The wrapper's own one-rank group: its construction sync and bucket rebuild stay here."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return dist.group.WORLD


def _manager(cfg: TrainConfig, replica: int, world: int, r: Replica) -> Manager:
    # Advertised to the peers (store, manager server, checkpoint server): an address, since a
    # container's hostname need not resolve in the others (the lab's nodes).
    host = socket.gethostbyname(socket.gethostname())
    store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False)
    r.store = store  # the replica group's store: kept alive as long as the manager
    timeout = timedelta(seconds=cfg.collective_timeout_s)
    r.transport = WatchedTransport(host, timeout=timeout, num_chunks=0)
    r.pg = WatchedGloo(timeout=timeout)
    return Manager(
        pg=r.pg,
        load_state_dict=r.load_state_dict,
        state_dict=r.state_dict,
        min_replica_size=(world + 1) // 2,
        use_async_quorum=False,
        timeout=timeout,
        quorum_timeout=timeout,
        connect_timeout=timeout,
        rank=0,
        world_size=1,
        store_addr=host,
        store_port=store.port,
        lighthouse_addr=f"http://{cfg.coordinator}",
        replica_id=f"replica_{replica}",
        hostname=host,
        checkpoint_transport=r.transport,
        init_sync=False,  # every replica builds the same seeded model
    )


def _wrap(cfg: TrainConfig, r: Replica) -> DistributedDataParallel:
    model = DistributedDataParallel(
        r.module,
        process_group=_local_group(),
        init_sync=False,
        bucket_cap_mb=cfg.bucket_cap_mb,
        overlap=cfg.overlap,
        find_unused_parameters=cfg.model == "branchy",
    )
    # The same plan on every replica, whatever order its first backward saw.
    model.restore_bucket_order(list(reversed(range(len(list(r.module.parameters()))))))
    model.register_comm_hook(r, manager_allreduce_hook)
    return model


def _step(cfg: TrainConfig, r: Replica, model: DistributedDataParallel) -> None:
    """One attempt at the next step, committed or not."""
    manager, wall0, t0 = r.manager, time.time(), time.perf_counter()
    r.noticed_t = None
    r.opt.zero_grad(set_to_none=True)
    manager.start_quorum()  # heals this replica (load_state_dict) if it is behind
    r.note_quorum()
    step = manager.current_step() + 1
    rank, world = manager.participating_rank(), manager.num_participants()
    rank, world = (0, 1) if rank is None else (rank, world)  # not taking part: zeros sent
    k, share = cfg.accumulate, 0.0
    for micro in range(k):
        idx, scale = r.batches.shard((step - 1) * k + micro, rank, world)
        with contextlib.nullcontext() if micro == k - 1 else model.no_sync():
            loss = F.cross_entropy(model(r.x[idx]), r.y[idx])
            if cfg.step_delay_ms and micro == k - 1:
                time.sleep(cfg.step_delay_ms / 1e3)
            (loss * (scale / k)).backward()
        share += loss.item() * len(idx) / cfg.batch_size / k
    comm_ms = model.reducer.last_comm_wait_s * 1e3
    err = manager.errored()
    if err is not None:
        why = error_meaning(str(err.original_exception))
        r.jlog.write(
            FaultRecord(r.replica, r.quorum_id, step, r.noticed_t or time.time(), "self", why)
        )
        r.noticed = True
    committed = manager.should_commit()
    if committed:
        r.opt.step()
    record = CommitRecord(r.replica, step, r.quorum_id, world, committed, time.time())
    if not committed:
        record.reason = "should_commit said no: " + (
            error_meaning(str(err)) if err else "a peer failed"
        )
        r.failed += 1
        r.jlog.write(record)
        return
    r.jlog.write(record)
    r.history.append({"step": step, "quorum": r.quorum_id, "world": world})
    step_ms = (time.perf_counter() - t0) * 1e3
    r.jlog.write(
        StepRecord(
            r.replica,
            step,
            share,
            checksum(r.module),
            step_ms,
            comm_ms,
            wall0,
            num_buckets=model.num_buckets,
        )
    )


def train_torchft(
    cfg: TrainConfig, replica: int, world: int, jlog: RecordLog, started_t: float
) -> bool:
    """Train replica ``replica`` to ``cfg.steps`` committed steps; True if every step 1..steps
    is in its history exactly once (the replicas' agreement is judged from their step
    records, by whoever reads them all)."""
    r = Replica(**job_parts(cfg, replica, jlog, started_t))
    r.manager = _manager(cfg, replica, world, r)
    r.registered_t = time.time()
    model = _wrap(cfg, r)
    wait_for_replicas(cfg.coordinator, world, cfg.collective_timeout_s)
    try:
        while r.manager.current_step() < cfg.steps:
            _step(cfg, r, model)
        v = judge_history(r.history, cfg.steps, r.failed, r.quorums)
        jlog.write(
            RecoveryVerdictRecord(
                replica, v.holds, v.committed, cfg.steps, r.failed, r.quorums, 0, v.message
            )
        )
        jlog.write(EndRecord(replica, v.holds, params_sha256(r.module)))
        return v.holds
    finally:
        r.manager.shutdown(wait=False)
