"""``--recovery torchft``: the same job as ``--recovery live``, driven by torchft's ``Manager``
(pytorch/torchft, pinned 0.2.0, the optional ``[torchft]`` extra) instead of our coordinator.

What stays ours: the model, the data (the global batch kept over any world,
``ddp.recovery.demo.batches``), the optimizer, and the wrapper, ``ddp.wrapper``'s
``DistributedDataParallel``. torchft drives it through the wrapper's comm-hook path, as
``torchft.ddp`` drives torch's: the wrapper is built on a local one-rank group (so its own
collectives, the construction sync and the bucket rebuild, stay on this process) and every
gradient bucket goes to ``Manager.allreduce``, which sends it over torchft's reconfigurable
gloo group of the current quorum. The bucket plan is fixed before the first step (the rebuild
would take each replica's own gradient order, and a healed replica must have its peers' plan).

What is torchft's: the lighthouse (``python -m ddp.recovery.demo.torchft.lighthouse``, its Rust
server) forms a quorum per step; each replica is a replica group of one rank with its own store and
manager server; a failed allreduce is swallowed and reported, ``should_commit`` then says no,
and the step is redone in the next quorum; a replica that joins receives the weights, the
momentum and the step from a peer over torchft's HTTP checkpoint transport.

Each replica writes the records of ``ddp.recovery.records`` (quorum, fault, commit, heal,
verdict), so ``ddp.recovery.demo.timeline`` reports a torchft run as it reports ours.

The files: ``lighthouse`` (start it, wait at it), ``replica`` (one replica's state and
torchft's pieces), ``rank`` (one replica's training loop), ``verdict`` (judging the run). This
module is what the rest of ``ddp`` calls, torch-free until a replica really runs: the check
that torchft is installed, and the start of one replica (which then ends with
``ddp.recovery.demo.rank.exit_now``: torchft's threads and an abandoned gloo group must not hold
the exit).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import Any

__all__ = ["MISSING", "quiet_torchft", "require_torchft", "run_torchft_rank"]

MISSING = (
    "--recovery torchft needs torchft, which is not installed: pip install -c constraints.txt "
    "-e '.[torchft]'"
)


def require_torchft() -> None:
    """ValueError (one line: what to install) when torchft cannot be imported."""
    if importlib.util.find_spec("torchft") is None:
        raise ValueError(MISSING)


def quiet_torchft() -> None:
    """torchft logs every quorum and commit (its Rust side at INFO, read from ``RUST_LOG`` when
    it is loaded): warnings and errors only, unless the user set ``RUST_LOG``."""
    os.environ.setdefault("RUST_LOG", "warn")
    logging.getLogger("torchft").setLevel(logging.CRITICAL)  # faults: our records


def run_torchft_rank(cfg: Any, rdzv: Any) -> bool:
    """Train replica ``rdzv.rank`` of ``rdzv.world_size`` (a ``Rendezvous``) with the
    lighthouse at ``cfg.coordinator`` (a ``TrainConfig``); its verdict (every step committed
    once)."""
    from ddp.program.records import RecordLog
    from ddp.recovery.api import process_start_time

    started = process_start_time()
    quiet_torchft()  # before torchft is loaded: its Rust side reads RUST_LOG then
    from ddp.recovery.demo.torchft.rank import train_torchft

    logging.getLogger("ddp").setLevel(logging.INFO)
    jlog = RecordLog(cfg.log_dir, rdzv.rank, echo=cfg.emit_records)
    try:
        return train_torchft(cfg, rdzv.rank, rdzv.world_size, jlog, started)
    finally:
        jlog.close()
