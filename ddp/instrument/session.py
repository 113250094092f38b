"""What one instrumented process keeps: its rank, its record log, its flight recorder, and
the modules to report on at exit.

Nothing happens until the script builds its first ``DistributedDataParallel``: by then the
process group exists, so the rank is the group's, and a process that never builds one (the
torchrun agent, a tool the script runs) writes nothing. The first module opens the record log
(``rank<R>.jsonl`` in ``DDP_LOG_DIR``), starts the flight recorder with its dump triggers and
registers the exit handler; every module gets a :class:`Probe` that turns its forwards into
step records.
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ddp.flight.recorder import FlightRecorder
from ddp.instrument.digest import params_sha256
from ddp.instrument.env import InstrumentEnv
from ddp.instrument.records import (
    ScriptDDPRecord,
    ScriptEndRecord,
    ScriptHookRecord,
    ScriptStepRecord,
)
from ddp.instrument.tally import StepTally
from ddp.instrument.trigger import DumpTriggers
from ddp.program.records import Record, RecordLog

__all__ = ["Probe", "Session", "session"]


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


@dataclass
class Probe:
    """One instrumented module: its step in progress and its collectives' tally."""

    session: Session
    index: int
    tally: StepTally
    params: list[torch.Tensor]  # kept (not the module) for the digest at exit
    step: int = 0  # steps started so far; the one in progress is ``step``
    t0: float | None = None  # wall clock at the start of the step in progress
    synced: bool = False  # the step in progress had its syncing forward
    on_step: list[Any] = field(default_factory=list)  # callbacks(step): the hook's label

    def on_forward(self, sync: bool) -> None:
        """A training forward (grad enabled): it starts a step, unless the step in progress
        has not synced yet (``no_sync`` micro-batches and the forward that ends them are one
        step)."""
        if self.t0 is None or self.synced:
            now = time.time()
            if self.t0 is not None:
                self.close(now)
            self.step += 1
            self.t0, self.synced = now, False
            for callback in self.on_step:
                callback(self.step)
        if sync:
            self.synced = True

    def close(self, t1: float) -> None:
        """Write the record of the step in progress, ending at ``t1``."""
        if self.t0 is None:
            return
        t0, self.t0 = self.t0, None
        buckets = self.tally.take()
        ends = [b[1] for b in buckets if b[1] is not None]
        comm_ms = (max(ends) - buckets[0][0]) * 1e3 if ends else 0.0
        self.session.write(
            ScriptStepRecord(
                self.session.rank,
                module=self.index,
                step=self.step,
                t0=t0,
                t1=t1,
                step_ms=round((t1 - t0) * 1e3, 3),
                allreduces=len(buckets),
                bytes=sum(b[2] for b in buckets),
                comm_ms=round(comm_ms, 3),
                buckets_ms=[
                    [
                        round((b[0] - t0) * 1e3, 3),
                        None if b[1] is None else round((b[1] - t0) * 1e3, 3),
                    ]
                    for b in buckets
                ],
                bucket_bytes=[b[2] for b in buckets],
            )
        )

    def finish(self) -> None:
        """At exit: the last step (ended by its last completed collective, else now) and the
        digest."""
        pending = self.tally._current
        ends = [b[1] for b in pending if b[1] is not None]
        self.close(max(ends) if ends else time.time())
        digest = params_sha256(self.params)
        self.session.write(
            ScriptEndRecord(self.session.rank, self.index, self.step, digest, time.time())
        )


class Session:
    """The process's instrumentation state (one per process: :func:`session`)."""

    def __init__(self, env: InstrumentEnv) -> None:
        self.env = env
        self.rank = 0
        self.world_size = 1
        self.probes: list[Probe] = []
        self.recorder: FlightRecorder | None = None
        self._log: RecordLog | None = None
        self._lock = threading.Lock()  # records come from the main thread and the exit handler
        self._triggers: DumpTriggers | None = None

    def _start(self) -> None:
        """On the first module: the rank, the log, the recorder, the triggers, the exit."""
        if dist.is_available() and dist.is_initialized():
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        else:  # single process, e.g. a DDP over a group the script made some other way
            self.rank = int(os.environ.get("RANK", "0"))
            self.world_size = max(int(os.environ.get("WORLD_SIZE", "1")), self.rank + 1)
        self._log = RecordLog(self.env.log_dir, self.rank, echo=self.env.emit_records)
        self.recorder = FlightRecorder(self.rank, self.world_size, self.env.flight_capacity)
        if self.env.log_dir:
            self._triggers = DumpTriggers(self.recorder, self.env.log_dir)
            self._triggers.start()
        atexit.register(self.finish)

    def attach(self, module: Any, wrapper: str) -> Probe:
        """A new ``DistributedDataParallel`` (``wrapper``: "torch" or "ddp"): its probe."""
        if self.recorder is None:
            self._start()
        assert self.recorder is not None
        inner = module.module
        params = [p for p in inner.parameters()]
        trained = [p for p in params if p.requires_grad]
        probe = Probe(self, len(self.probes), StepTally(self.recorder), params)
        self.probes.append(probe)
        local = os.environ.get("LOCAL_RANK")
        self.write(
            ScriptDDPRecord(
                self.rank,
                module=probe.index,
                wrapper=wrapper,
                world_size=self.world_size,
                pid=os.getpid(),
                t=time.time(),
                local_rank=int(local) if local and local.isdigit() else None,
                host=socket.gethostname(),
                params=sum(p.numel() for p in trained),
                param_bytes=sum(p.numel() * p.element_size() for p in trained),
                model=type(inner).__name__,
                argv=list(sys.argv),
            )
        )
        return probe

    def hook_registered(self, probe: Probe, hook: Any) -> None:
        name = getattr(hook, "__qualname__", None) or type(hook).__qualname__
        self.write(ScriptHookRecord(self.rank, probe.index, name, time.time()))

    def write(self, record: Record) -> None:
        with self._lock:
            if self._log is not None:
                self._log.write(record)

    def finish(self) -> None:
        """At exit: every module's last step and digest, then the flight recorder's exit dump
        (so a diagnosis also has the ranks that ended)."""
        for probe in self.probes:
            try:
                probe.finish()
            except Exception as e:  # one module's failure must not hide the others' records
                print(
                    f"ddp.instrument: no end record for module {probe.index}: {e}", file=sys.stderr
                )
        if self._triggers is not None:
            self._triggers.stop()
            try:
                self._triggers.dump("exit")
            except OSError as e:
                print(f"ddp.instrument: no exit dump: {e}", file=sys.stderr)
        with self._lock:
            if self._log is not None:
                self._log.close()
                self._log = None


_SESSION: Session | None = None


def session() -> Session:
    """The process's session, made from the environment when the first DDP is built (until
    then the environment may still change: ``python -m ddp`` switches the instrumentation
    off for itself)."""
    global _SESSION
    if _SESSION is None:
        _SESSION = Session(InstrumentEnv.from_environ())
    return _SESSION
