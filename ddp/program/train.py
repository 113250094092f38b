"""One rank's run, shared by ``python -m ddp`` (spawned ranks), ``python -m ddp train`` (one
externally launched rank, e.g. a container) and torchrun (env://): join the rendezvous, start
the process group, run the training loop (``ddp.program.loop``), and turn a collective that
failed because of another rank into a diagnosis that names it.
"""

from __future__ import annotations

import gc
import importlib
import os
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from ddp.flight.diagnosis import PeerFailure, explain_failure
from ddp.flight.recorder import FlightRecorder
from ddp.instrument.env import ENV_INSTRUMENT
from ddp.program.config import Rendezvous, TrainConfig
from ddp.program.loop import train
from ddp.program.records import FailureRecord, RecordLog
from ddp.program.rendezvous import NeverJoined, join
from ddp.program.resume import NothingToResume

__all__ = ["NothingToResume", "PeerFailure", "run_rank"]


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
    # This program writes its own records to rank<R>.jsonl: the instrumentation of unchanged
    # scripts (ddp.instrument), if it is on, must not write a second log beside them.
    os.environ[ENV_INSTRUMENT] = "0"
    if cfg.recovery == "live":  # a quorum per step instead of one group (ddp.recovery)
        from ddp.recovery.demo.rank import run_live_rank

        return run_live_rank(cfg, rdzv)
    if cfg.recovery == "torchft":  # the same under torchft's Manager (ddp.recovery.demo.torchft)
        from ddp.recovery.demo.torchft import run_torchft_rank

        return run_torchft_rank(cfg, rdzv)
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
            holds = train(cfg, rdzv.rank, rdzv.world_size, jlog, recorder)
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
