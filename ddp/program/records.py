"""The log schema: typed records a rank writes, one writer and one reader.

Every rank writes ``<log_dir>/rank<R>.jsonl``, one JSON object per line with an ``event`` key:
``config`` (set up, about to train), ``step`` (one optimizer step: loss, checksum, times and the
bucket timeline), ``plan`` (``--comm auto`` chose or checked its cap and algorithm),
``verdict`` (rank 0: does parity hold), ``failure`` (a peer died or stalled: the diagnosis)
and ``end`` (the final parameters' digest). With ``emit_records`` the same records also go
to stdout as ``@ddp {json}`` lines, so a program that follows the run (the lab) learns
progress and verdicts from data, never from the human-readable table, which may change freely.
A script run under ``ddp.instrument`` writes the ``script_*`` records
(``ddp.instrument.records``) to the same kind of log, read by the same reader.

One rule for a torn last line, in every reader: a run still being written, or a rank killed
mid-write, leaves a last line without its end; it is dropped (``RankLog.torn``). A bad line
anywhere else is corruption and raises :class:`LogError`. Torch-free.

A process that finds its rank's log already there (torchrun's agent restarted the worker
group, or a directory is reused) keeps it and writes the next attempt beside it,
``rank<R>.attempt<N>.jsonl`` (N = 1, 2, ...; the first free one, created exclusively): each
attempt is one file with its own torn-last-line rule. :func:`load_run` gives every rank's
newest attempt, :func:`load_attempts` all of them, oldest first. The writer numbers the
attempts, not torchrun: its ``TORCHELASTIC_RESTART_COUNT`` is per agent, and an agent that
restarts its workers because another node's worker failed does not count a restart.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ddp.instrument.records import SCRIPT_RECORDS, ScriptEndRecord, ScriptStepRecord
from ddp.record import RECORD_PREFIX, Record, RecordLog, log_name
from ddp.recovery.records import KINDS

__all__ = [
    "RECORD_PREFIX",
    "ConfigRecord",
    "EndRecord",
    "FailureRecord",
    "LogError",
    "PlanRecord",
    "RankLog",
    "Record",
    "RecordLog",
    "StepRecord",
    "VerdictRecord",
    "load_attempts",
    "load_run",
    "log_name",
    "parse_record_line",
    "read_rank_log",
]

_LOG_NAME = re.compile(r"^rank(\d+)(?:\.attempt(\d+))?\.jsonl$")


def _parse_name(name: str) -> tuple[int, int] | None:
    """(rank, attempt) of a log file's name, or None if it is not a rank log."""
    m = _LOG_NAME.match(name)
    return None if m is None else (int(m.group(1)), int(m.group(2) or 0))


class LogError(ValueError):
    """A rank log that cannot be read: the message names the file and line."""


@dataclass
class ConfigRecord(Record):
    """Written once the model is wrapped, just before the first step."""

    event: ClassVar[str] = "config"
    world_size: int
    num_buckets: int
    start_step: int  # 0, or the checkpoint step a resumed run continues after
    config: dict[str, Any] = field(default_factory=dict)  # TrainConfig.to_dict()
    # This process's id in its own pid namespace (a container's): what a fault injector
    # signals to hit this rank, e.g. one worker of several that torchrun runs in a node.
    pid: int | None = None
    # Per bucket, in launch order, the shapes of its parameters in buffer order: what each
    # allreduce (or comm hook) is handed. None from writers older than this field.
    bucket_shapes: list[list[list[int]]] | None = None


@dataclass
class StepRecord(Record):
    """One optimizer step on one rank. Times in ms; ``t0`` is the wall clock at the step's
    start (ranks in containers of one host share it); ``backward_ms`` ``[start, end]`` and
    ``buckets_ms`` ``[[launch, done], ...]`` are relative to the step's start."""

    event: ClassVar[str] = "step"
    step: int
    loss: float
    checksum: float
    step_ms: float
    comm_ms: float
    t0: float | None = None
    backward_ms: list[float] | None = None
    buckets_ms: list[list[float]] | None = None
    num_buckets: int | None = None  # allreduce calls this step (the plan is rebuilt after step 1)
    ref_loss: float | None = None  # rank 0 only: the single-process reference
    ref_checksum: float | None = None
    max_param_diff: float | None = None
    # --bucket-cap-mb auto, on the step whose forward rebuilt the buckets: the cap chosen, the
    # fitted link and each candidate's predicted communication (ddp.wrapper.auto_tune)
    auto_cap: dict[str, Any] | None = None
    # What the rank holds after this step (ddp.program.memory): its process's peak resident
    # set so far, and the bytes of its optimizer's state (its shard's, when sharded). None
    # from writers older than these fields.
    peak_rss_mib: float | None = None
    optimizer_state_bytes: int | None = None


@dataclass
class PlanRecord(Record):
    """``--comm auto`` decided (``ddp.wrapper.comm_auto``), the same on every rank: from
    ``step`` on, buckets of ``cap_mb`` averaged by ``algorithm`` (``flat``, or two levels whose
    cross-node exchange is ``ring``, ``direct`` or ``recursive-doubling``). ``predicted_ms``:
    the model's end of communication, ms after backward began; ``measured_ms``: the same span
    as rank 0's reducer measured it under this plan (median of the last steps; None when the
    record starts a plan, ``changed``; a record that keeps a plan gives the model's prediction
    once it learned the cost per call from those steps). ``previous_measured_ms``: what the
    plan it replaced measured. ``reason``: why, in one line. Every rank writes the same."""

    event: ClassVar[str] = "plan"
    step: int
    cap_mb: float
    algorithm: str
    predicted_ms: float | None
    measured_ms: float | None
    reason: str
    changed: bool = True
    previous_measured_ms: float | None = None
    call_ms: dict[str, float] | None = None


@dataclass
class VerdictRecord(Record):
    """Rank 0's parity verdict; ``message`` is the line it printed."""

    event: ClassVar[str] = "verdict"
    holds: bool
    message: str


@dataclass
class FailureRecord(Record):
    """This rank stopped because a collective failed: ``message`` is the diagnosis."""

    event: ClassVar[str] = "failure"
    message: str
    missing_ranks: list[int] = field(default_factory=list)


@dataclass
class EndRecord(Record):
    """The last record of a rank that finished: its verdict and final parameters' sha256."""

    event: ClassVar[str] = "end"
    parity: bool
    params_sha256: str


_TYPES: dict[str, type[Record]] = {
    t.event: t
    for t in (
        ConfigRecord,
        StepRecord,
        PlanRecord,
        VerdictRecord,
        FailureRecord,
        EndRecord,
        *SCRIPT_RECORDS,
    )
}


def _from_dict(data: Any) -> Record | None:
    """A typed record, or None for an event this version does not know (newer writers)."""
    if not isinstance(data, dict) or not isinstance(data.get("event"), str):
        raise ValueError("not a record (no 'event')")
    kind = _TYPES.get(data["event"])
    if kind is None:  # live recovery's events, which the protocol defines
        kind = KINDS.get(data["event"])
    if kind is None:
        return None
    names = {f.name for f in dataclasses.fields(kind)}
    try:
        return kind(**{k: v for k, v in data.items() if k in names})
    except TypeError as e:
        raise ValueError(f"{data['event']} record: {e}") from None


def parse_record_line(text: str) -> Record | None:
    """The record carried by one stdout line (``@ddp {json}``), else None.

    The record may follow the start of another process's line: ranks that share one stdout
    (torchrun's workers) each write a record in one call, but an unbuffered ``print`` writes
    its text and its newline in two, and another rank's record can land between them."""
    start = text.find(RECORD_PREFIX + "{")
    if start < 0:
        return None
    try:
        return _from_dict(json.loads(text[start + len(RECORD_PREFIX) :]))
    except ValueError:
        return None  # cut short by a kill: the file log has the rule for that


@dataclass
class RankLog:
    """Everything one rank wrote, by kind."""

    rank: int
    records: list[Record] = field(default_factory=list)
    torn: bool = False  # the last line was cut short and dropped
    attempt: int = 0  # 0: the rank's first log in the directory; N: rank<R>.attempt<N>.jsonl

    def _last(self, kind: type[Record]) -> Any:
        return next((r for r in reversed(self.records) if isinstance(r, kind)), None)

    @property
    def config(self) -> ConfigRecord | None:
        return self._last(ConfigRecord)

    @property
    def steps(self) -> list[StepRecord]:
        return [r for r in self.records if isinstance(r, StepRecord)]

    @property
    def auto_cap_mb(self) -> float | None:
        """The cap ``bucket_cap_mb="auto"`` chose, on the step that rebuilt the buckets (the
        same on every rank); None when the rank did not choose one."""
        return next((float(r.auto_cap["cap_mb"]) for r in self.steps if r.auto_cap), None)

    @property
    def plans(self) -> list[PlanRecord]:
        """``--comm auto``'s decisions, oldest first (the same on every rank)."""
        return [r for r in self.records if isinstance(r, PlanRecord)]

    @property
    def script_steps(self) -> list[ScriptStepRecord]:
        """The steps an instrumented script reported (``ddp.instrument``), every module's."""
        return [r for r in self.records if isinstance(r, ScriptStepRecord)]

    @property
    def script_end(self) -> list[ScriptEndRecord]:
        """An instrumented script's exit records, one per module it built."""
        return [r for r in self.records if isinstance(r, ScriptEndRecord)]

    @property
    def verdict(self) -> VerdictRecord | None:
        return self._last(VerdictRecord)

    @property
    def failure(self) -> FailureRecord | None:
        return self._last(FailureRecord)

    @property
    def end(self) -> EndRecord | None:
        return self._last(EndRecord)


def read_rank_log(path: Path, rank: int | None = None) -> RankLog:
    """Read one ``rank<R>.jsonl`` or ``rank<R>.attempt<N>.jsonl`` (see the module's rule for a
    torn last line)."""
    path = Path(path)
    named = _parse_name(path.name)
    if rank is None and named is None:
        raise LogError(f"{path}: not a rank log name (rank<R>.jsonl); pass its rank")
    log = RankLog(rank if rank is not None else named[0], attempt=named[1] if named else 0)
    lines = [(n, line) for n, line in enumerate(path.read_text().splitlines(), 1) if line.strip()]
    for i, (n, line) in enumerate(lines):
        try:
            record = _from_dict(json.loads(line))
        except ValueError as e:  # json.JSONDecodeError is a ValueError
            if i == len(lines) - 1:
                log.torn = True
                break
            raise LogError(f"{path}:{n}: not a record ({e})") from None
        if record is not None:
            log.records.append(record)
    return log


def load_attempts(log_dir: Path, skip: frozenset[Path] = frozenset()) -> dict[int, list[RankLog]]:
    """Every attempt of every rank in ``log_dir``, by rank, oldest first (empty: no logs);
    ``skip``: files to leave out (an earlier run's, in a reused directory)."""
    found: dict[int, list[tuple[int, Path]]] = {}
    for path in Path(log_dir).glob("rank*.jsonl"):
        named = _parse_name(path.name)
        if path in skip:
            continue
        if named is not None:
            found.setdefault(named[0], []).append((named[1], path))
    return {
        rank: [read_rank_log(path, rank) for _, path in sorted(paths)]
        for rank, paths in sorted(found.items())
    }


def load_run(log_dir: Path) -> dict[int, RankLog]:
    """Every rank's newest attempt in ``log_dir``, by rank (empty when there is none): what a
    run restarted by torchrun ended with. After an elastic restart that shrank the world
    (``--nnodes MIN:MAX``, a node gone for good), the ranks past rank 0's newest world size
    left only logs of the earlier world: they are not part of how the run ended, so they are
    left out."""
    newest = {rank: attempts[-1] for rank, attempts in load_attempts(log_dir).items()}
    last_config = newest[0].config if 0 in newest else None
    if last_config is None:
        return newest
    return {rank: log for rank, log in newest.items() if rank < last_config.world_size}
