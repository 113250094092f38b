"""One rank of a live run, as ``python -m ddp train --recovery live`` starts it, and how it
ends: ``os._exit``, because a gloo group abandoned after a fault may still hold a thread inside
a collective until gloo's timeout, and a normal interpreter exit would wait for it.
"""

from __future__ import annotations

import logging
import os
import sys

from ddp.flight.diagnosis import PeerFailure
from ddp.program.config import Rendezvous, TrainConfig
from ddp.program.records import FailureRecord, RecordLog

__all__ = ["exit_now", "run_live_rank"]


def run_live_rank(cfg: TrainConfig, rdzv: Rendezvous) -> bool:
    """Train replica ``rdzv.rank`` on the job's etcd (named by the environment); the live
    verdict (every step committed once, replicas identical after each)."""
    from ddp.recovery.api import process_start_time  # torch, only once a rank really runs
    from ddp.recovery.demo.live import train_live

    started = process_start_time()
    # Whoever is group rank 0 prints the table (rank 0 may be lost): every rank may log info.
    logging.getLogger("ddp").setLevel(logging.INFO)
    jlog = RecordLog(cfg.log_dir, rdzv.rank, echo=cfg.emit_records)
    try:
        return train_live(cfg, rdzv.rank, jlog, started)
    except PeerFailure as e:  # the run stops (exit 3): its one-line diagnosis as a record too
        jlog.write(FailureRecord(rdzv.rank, str(e), e.missing_ranks))
        raise
    finally:
        jlog.close()


def exit_now(code: int) -> None:
    """End the process without waiting for abandoned gloo threads (see the module)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
