"""The live training loop of one rank of the demo program (``python -m ddp train --recovery
live``), a client of ``ddp.recovery.api`` like any user's loop: the manager enters the quorums,
averages the gradients, votes on every commit and heals whoever is behind; this loop adds what
only the demo program does: the typed records of every step, the per-step replica check, the
single-process reference on group rank 0 (so when rank 0 is lost the lowest survivor takes it
over and parity stays judged, each step anchored on the replicas' weights, see
``ddp.program.reference``), and the verdict at the end.
"""

from __future__ import annotations

from ddp.program.config import TrainConfig
from ddp.program.records import EndRecord, RecordLog
from ddp.program.reference import params_sha256
from ddp.recovery.api import Manager
from ddp.recovery.demo.job import job_parts
from ddp.recovery.demo.step import LiveRun, finish_check, log, run_step
from ddp.recovery.demo.verdict import judge
from ddp.recovery.records import QuorumRecord, Record, RecoveryVerdictRecord
from ddp.wrapper.distributed import DistributedDataParallel

__all__ = ["train_live"]


def train_live(cfg: TrainConfig, replica: int, jlog: RecordLog, started_t: float) -> bool:
    """Train from wherever the quorum stands to ``cfg.steps``; True if the live verdict
    holds (every step committed once, replicas identical after each)."""
    run = LiveRun(**job_parts(cfg, replica, jlog, started_t))

    def record(r: Record) -> None:
        if isinstance(r, QuorumRecord) and cfg.reference:
            r.reference_rank = r.members[0]  # group rank 0 runs the reference
        jlog.write(r)

    run.manager = Manager(
        run.state_dict,
        run.load_state_dict,
        record=record,
        replica=replica,
        heartbeat_timeout_s=cfg.heartbeat_timeout_s,
        timeout_s=cfg.collective_timeout_s,
        commit_digests=cfg.commit_digests,
    )
    model = DistributedDataParallel(
        run.module,
        process_group=run.manager.local_group,
        init_sync=False,  # the first quorum's heal exchange makes every member identical
        bucket_cap_mb=cfg.bucket_cap_mb,
        overlap=cfg.overlap,
        find_unused_parameters=cfg.model == "branchy",
    )
    run.model = run.manager.wrap(model)
    while run.manager.step < cfg.steps:
        run_step(run)
    return _finish(run)


def _finish(run: LiveRun) -> bool:
    cfg, m = run.cfg, run.manager
    finish_check(run)
    v = judge(run.history, cfg.steps, cfg.tolerance, m.failed, m.quorums)
    run.jlog.write(
        RecoveryVerdictRecord(
            run.replica, v.holds, v.committed, cfg.steps, m.failed, m.quorums, v.judged, v.message
        )
    )
    if m.group_rank == 0:
        log.info(v.message)
    m.close()
    run.jlog.write(EndRecord(run.replica, v.holds, params_sha256(run.module)))
    return v.holds
