"""The records an instrumented script writes, in the shape of ``ddp.program.records`` and read
by its one reader (``read_rank_log``, ``load_run``, ``parse_record_line``).

Each process writes, per ``DistributedDataParallel`` module it builds (``module``: 0 for the
first, 1 for the next, ...):

* ``script_ddp`` once, when the module is built: who this rank is, which class, how big.
* ``script_hook`` when the script registers its own comm hook (it runs, wrapped).
* ``script_step`` per step. A step starts at a training forward of the module (grad enabled)
  and ends when the next step starts, or at exit; forwards under ``no_sync()`` belong to the
  step whose forward syncs. So a step is one optimizer step of a usual loop, and its record
  is written when the next one begins.
* ``script_end`` at exit: the steps done and the sha256 of the parameters, so a reader can
  tell whether the replicas ended identical.

Times are wall clock (``time.time()``; ranks in containers of one host share it); ``ms``
fields are milliseconds. Torch-free.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import ClassVar

from ddp.record import Record

__all__ = [
    "SCRIPT_RECORDS",
    "ScriptDDPRecord",
    "ScriptEndRecord",
    "ScriptHookRecord",
    "ScriptStepRecord",
]


@dataclass
class ScriptDDPRecord(Record):
    """A ``DistributedDataParallel`` was built. ``wrapper``: ``"torch"`` or ``"ddp"`` (ours);
    ``pid``: this process in its own pid namespace (what a fault injector signals);
    ``params``/``param_bytes``: the parameters that require grad (what is averaged)."""

    event: ClassVar[str] = "script_ddp"
    module: int
    wrapper: str
    world_size: int
    pid: int
    t: float
    local_rank: int | None = None
    host: str = ""
    params: int = 0
    param_bytes: int = 0
    model: str = ""  # the wrapped module's class name
    argv: list[str] = field(default_factory=list)


@dataclass
class ScriptHookRecord(Record):
    """The script registered its own comm hook ``hook`` (its qualified name); it runs inside
    the instrumentation's hook, which times it."""

    event: ClassVar[str] = "script_hook"
    module: int
    hook: str
    t: float


@dataclass
class ScriptStepRecord(Record):
    """One step of one rank (see the module's docstring for where a step starts and ends).

    ``allreduces``: the gradient buckets communicated in the step (one allreduce each, or one
    call of the comm hook); ``bytes``: their sizes summed (what this rank handed over, before
    any compression a hook does); ``comm_ms``: from the first launch to the last completion;
    ``buckets_ms``: each one's ``[launch, done]`` relative to ``t0``, in launch order (done is
    None if it had not completed when the step ended); ``bucket_bytes``: each one's size."""

    event: ClassVar[str] = "script_step"
    module: int
    step: int
    t0: float
    t1: float
    step_ms: float
    allreduces: int
    bytes: int
    comm_ms: float
    buckets_ms: list[list[float | None]] = field(default_factory=list)
    bucket_bytes: list[int] = field(default_factory=list)

    def to_json(self) -> str:
        # Written every step of a script being timed: the same line as Record.to_json, without
        # dataclasses.asdict's deep copy (a third of the instrumentation's per-step cost).
        return json.dumps({"event": self.event, **vars(self)})


@dataclass
class ScriptEndRecord(Record):
    """At exit: ``steps`` done, and the sha256 over the module's parameters' bytes in
    ``parameters()`` order (equal digests: bitwise-identical replicas)."""

    event: ClassVar[str] = "script_end"
    module: int
    steps: int
    params_sha256: str
    t: float


SCRIPT_RECORDS: tuple[type[Record], ...] = (
    ScriptDDPRecord,
    ScriptHookRecord,
    ScriptStepRecord,
    ScriptEndRecord,
)
