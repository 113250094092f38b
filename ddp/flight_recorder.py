"""Flight recorder: the last N collectives of one rank, dumped to disk when things go wrong.

When one rank dies or stalls, the others block inside a collective and gloo only says
"timed out" or "connection closed". To say *who* is missing and *where*, every rank keeps a
small ring buffer of the collectives it issued (sequence number, step, bucket, bytes, times,
state) and writes it to a shared directory on timeout, on error and at exit. Because all
ranks issue collectives in the same order, the per-rank sequence numbers line up across
ranks, and `ddp.diagnosis` compares the dumps to find the ranks that never arrived.

`start`/`complete` are called from the backward hot path, so they are O(1), do no I/O and
take one uncontended lock (completion of async gloo work may be observed from another thread).
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

__all__ = [
    "DUMP_REASONS",
    "CollectiveRecord",
    "FlightRecorder",
    "dump_path",
    "load_dumps",
]

log = logging.getLogger(__name__)

DUMP_REASONS = ("timeout", "error", "exit")
_DUMP_RE = re.compile(r"^flight_rank(\d+)\.json$")
_FORMAT = 1


@dataclass(slots=True)
class CollectiveRecord:
    """One collective call as this rank saw it."""

    seq: int  # per-rank sequence number; identical across ranks (same issue order everywhere)
    op: str  # "allreduce", "broadcast", "all_gather", ...
    step: int  # training step, -1 outside the loop (e.g. the initial broadcast)
    bucket: int | None  # bucket index for gradient allreduces
    nbytes: int
    start: float  # time.time() when issued
    end: float | None  # time.time() when it completed or failed; None while pending
    state: str  # "started" | "completed" | "failed"
    error: str | None = None  # the error text for a failed collective


def dump_path(directory: Path, rank: int) -> Path:
    """Where rank `rank` writes its dump inside `directory`."""
    return Path(directory) / f"flight_rank{rank}.json"


class FlightRecorder:
    """Keeps the last `capacity` collectives of this rank in a ring buffer.

    Sequence numbers count every collective ever started on this rank (not only the ones still
    in the buffer), so ranks can be compared even after the buffer wrapped.
    """

    def __init__(self, rank: int, world_size: int, capacity: int = 256) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.rank = rank
        self.world_size = world_size
        self.capacity = capacity
        self._ring: list[CollectiveRecord | None] = [None] * capacity
        self._next_seq = 0
        self._last_completed = -1  # highest completed seq (completion may be out of order)
        self._lock = threading.Lock()

    def start(self, op: str, *, step: int, bucket: int | None = None, nbytes: int = 0) -> int:
        """Record that a collective was issued; returns its sequence number."""
        now = time.time()
        with self._lock:
            seq = self._next_seq
            self._next_seq = seq + 1
            self._ring[seq % self.capacity] = CollectiveRecord(
                seq, op, step, bucket, nbytes, now, None, "started"
            )
        return seq

    def complete(self, seq: int) -> None:
        """Mark collective `seq` completed (a no-op if it already fell out of the buffer)."""
        now = time.time()
        with self._lock:
            rec = self._live(seq)
            if seq > self._last_completed:
                self._last_completed = seq
            # A failure is final: a late completion callback must not hide it.
            if rec is not None and rec.state == "started":
                rec.end = now
                rec.state = "completed"

    def fail(self, seq: int, error: str) -> None:
        """Mark collective `seq` failed with `error` (e.g. the gloo exception text)."""
        now = time.time()
        with self._lock:
            rec = self._live(seq)
            if rec is not None:
                rec.end = now
                rec.state = "failed"
                rec.error = error

    def _live(self, seq: int) -> CollectiveRecord | None:
        # Caller holds the lock.
        if not 0 <= seq < self._next_seq:
            raise ValueError(f"seq {seq} was never started on rank {self.rank}")
        rec = self._ring[seq % self.capacity]
        return rec if rec is not None and rec.seq == seq else None

    @property
    def last_started_seq(self) -> int:
        """Highest sequence number started so far (-1 before the first collective)."""
        return self._next_seq - 1

    def records(self) -> list[CollectiveRecord]:
        """Copies of the buffered records, oldest first."""
        with self._lock:
            first = max(0, self._next_seq - self.capacity)
            live = [self._ring[s % self.capacity] for s in range(first, self._next_seq)]
            return [replace(r) for r in live if r is not None]

    def snapshot(self, reason: str) -> dict[str, Any]:
        """The dump content as a JSON-ready dict (what `dump` writes)."""
        if reason not in DUMP_REASONS:
            raise ValueError(f"reason must be one of {DUMP_REASONS}, got {reason!r}")
        records = self.records()
        with self._lock:
            last_started, last_completed = self._next_seq - 1, self._last_completed
        return {
            "format": _FORMAT,
            "rank": self.rank,
            "world_size": self.world_size,
            "reason": reason,
            "time": time.time(),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "capacity": self.capacity,
            "last_started_seq": last_started,
            "last_completed_seq": last_completed,
            "records": [asdict(r) for r in records],
        }

    def dump(self, directory: Path, reason: str) -> Path:
        """Atomically write `<directory>/flight_rank<R>.json` and return its path.

        Readers on other ranks poll the directory, so they must never see a half-written file:
        write a temp file beside it, fsync, then os.replace.
        """
        data = self.snapshot(reason)
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        final = dump_path(directory, self.rank)
        tmp = directory / f".{final.name}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        return final


def _valid_dump(data: Any, rank: int) -> bool:
    return (
        isinstance(data, dict)
        and data.get("rank") == rank
        and isinstance(data.get("world_size"), int)
        and isinstance(data.get("last_started_seq"), int)
        and isinstance(data.get("time"), (int, float))
        and isinstance(data.get("records"), list)
        and all(isinstance(r, dict) and isinstance(r.get("seq"), int) for r in data["records"])
    )


def load_dumps(directory: Path, *, newer_than: float | None = None) -> dict[int, dict]:
    """Read every `flight_rank<R>.json` in `directory`: rank -> parsed dump.

    Partial, corrupt or inconsistent files are skipped with a warning rather than raised:
    a diagnosis built from the dumps that *are* readable beats none. Dumps written before
    `newer_than` (a time.time() value, e.g. the start of this run) are ignored as stale.
    """
    directory = Path(directory)
    dumps: dict[int, dict] = {}
    if not directory.is_dir():
        return dumps
    for path in sorted(directory.iterdir()):
        m = _DUMP_RE.match(path.name)
        if m is None:
            continue
        rank = int(m.group(1))
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            log.warning("skipping unreadable flight recorder dump %s: %s", path, e)
            continue
        if not _valid_dump(data, rank):
            log.warning("skipping malformed flight recorder dump %s", path)
            continue
        if newer_than is not None and data["time"] < newer_than:
            log.debug("skipping stale flight recorder dump %s", path)
            continue
        dumps[rank] = data
    return dumps
