"""One torchft replica as ``python -m ddp train --recovery torchft`` starts it (the process
then ends with ``ddp.recovery.rank.exit_now``: torchft's threads and an abandoned gloo group
must not hold the exit)."""

from __future__ import annotations

import logging
import os

from ddp.program.config import Rendezvous, TrainConfig
from ddp.program.records import RecordLog

__all__ = ["quiet_torchft", "run_torchft_rank"]


def quiet_torchft() -> None:
    """torchft logs every quorum and commit (its Rust side at INFO, read from ``RUST_LOG`` when
    it is loaded): warnings and errors only, unless the user set ``RUST_LOG``."""
    os.environ.setdefault("RUST_LOG", "warn")
    logging.getLogger("torchft").setLevel(logging.CRITICAL)  # faults: our records


def run_torchft_rank(cfg: TrainConfig, rdzv: Rendezvous) -> bool:
    """Train replica ``rdzv.rank`` of ``rdzv.world_size`` with the lighthouse at
    ``cfg.coordinator``; its verdict (every step committed once)."""
    from ddp.recovery.api import process_start_time

    started = process_start_time()
    quiet_torchft()
    from ddp.recovery.tft.rank import train_torchft  # torch and torchft, only once it runs

    logging.getLogger("ddp").setLevel(logging.INFO)
    jlog = RecordLog(cfg.log_dir, rdzv.rank, echo=cfg.emit_records)
    try:
        return train_torchft(cfg, rdzv.rank, rdzv.world_size, jlog, started)
    finally:
        jlog.close()
