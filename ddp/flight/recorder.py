"""Flight recorder: the last N collectives of one rank, dumped to disk when things go wrong.

When one rank dies or stalls, the others block inside a collective and gloo only says
"timed out" or "connection closed". To say *who* is missing and *where*, every rank keeps a
small ring buffer of the collectives it issued (sequence number, step, bucket, bytes, times,
state) and writes it to a shared directory on timeout, on error and at exit. Because all
ranks issue collectives in the same order, the per-rank sequence numbers line up across
ranks, and `ddp.flight.diagnosis` compares the dumps to find the ranks that never arrived.

`start`/`complete` are called from the backward hot path, so they are O(1), do no I/O and
take one uncontended lock (completion of async gloo work may be observed from another thread).

Not every survivor notices a dead peer at once: with 4 gloo ranks and rank 2 SIGKILLed, ranks
1 and 3 get "Connection closed by peer" within ~0.05 s while rank 0, waiting on a live peer,
blocks until the process group timeout. Treating "no dump yet" as "missing" would then blame
rank 0. So a rank can `watch` the dump directory from a daemon thread: the first rank that
notices a failure calls `request_dumps`, and every rank that is still alive (even one blocked
inside a collective, which releases the GIL) dumps within a poll interval with reason
"requested". Only killed or stopped ranks stay silent.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ddp.flight.dumps import (
    DUMP_FORMAT,
    DUMP_REASONS,
    REQUEST_FILE,
    dump_path,
)

__all__ = ["CollectiveRecord", "FlightRecorder"]

log = logging.getLogger(__name__)


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
        self._dump_lock = threading.Lock()  # main thread and watcher may dump at once
        self._final_dump = False  # a timeout/error/exit dump must not be replaced by "requested"
        self._watch_stop: threading.Event | None = None
        self._watcher: threading.Thread | None = None

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

    @contextlib.contextmanager
    def record(
        self, op: str, *, step: int, bucket: int | None = None, nbytes: int = 0
    ) -> Iterator[int]:
        """Record a blocking collective run inside the ``with`` block (failed if it raises)."""
        seq = self.start(op, step=step, bucket=bucket, nbytes=nbytes)
        try:
            yield seq
        except BaseException as e:
            self.fail(seq, str(e) or type(e).__name__)
            raise
        self.complete(seq)

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
            "format": DUMP_FORMAT,
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
        write a temp file beside it, fsync, then os.replace. A "requested" dump is skipped once
        this rank wrote a timeout/error/exit dump (that one says more).
        """
        directory = Path(directory)
        final = dump_path(directory, self.rank)
        with self._dump_lock:
            if reason == "requested" and self._final_dump:
                return final
            data = self.snapshot(reason)
            directory.mkdir(parents=True, exist_ok=True)
            tmp = directory / f".{final.name}.{os.getpid()}.tmp"
            try:
                with open(tmp, "w", encoding="utf-8") as f:
                    json.dump(data, f, indent=1)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, final)
            finally:
                tmp.unlink(missing_ok=True)
            if reason != "requested":
                self._final_dump = True
        return final

    def watch(self, directory: Path, *, poll_s: float = 0.1) -> None:
        """Dump (reason "requested") whenever another rank calls `request_dumps(directory)`.

        Runs a daemon thread that stats one file every `poll_s` seconds; requests older than
        this call (a previous run's file) are ignored. Stop it with `stop_watching`.
        """
        if self._watcher is not None:
            raise RuntimeError(f"rank {self.rank} is already watching a dump directory")
        if poll_s <= 0:
            raise ValueError(f"poll_s must be > 0, got {poll_s}")
        stop = threading.Event()
        self._watch_stop = stop
        self._watcher = threading.Thread(
            target=self._watch_loop,
            args=(Path(directory), poll_s, stop),
            name=f"flight-recorder-watch-rank{self.rank}",
            daemon=True,
        )
        self._watcher.start()

    def stop_watching(self, timeout_s: float = 5.0) -> None:
        """Stop the `watch` thread (no-op if not watching)."""
        if self._watcher is None:
            return
        assert self._watch_stop is not None
        self._watch_stop.set()
        self._watcher.join(timeout_s)
        self._watcher = self._watch_stop = None

    def _watch_loop(self, directory: Path, poll_s: float, stop: threading.Event) -> None:
        request = directory / REQUEST_FILE
        # Every request replaces the file, so any change of its mtime is a new request; what
        # is there already belongs to an earlier run.
        try:
            seen = request.stat().st_mtime_ns
        except OSError:
            seen = -1
        while not stop.wait(poll_s):
            try:
                mtime = request.stat().st_mtime_ns
            except FileNotFoundError:
                continue
            except OSError as e:
                log.warning("flight recorder watch: cannot stat %s: %s", request, e)
                continue
            if mtime != seen:
                seen = mtime
                try:
                    self.dump(directory, "requested")
                except OSError as e:
                    log.warning("flight recorder watch: requested dump failed: %s", e)
