"""A flight recorder that also counts each step's gradient collectives.

The per-step figures (how many allreduces, their bytes, their times) and the flight recorder's
ring see the same events, so they come from one place: :class:`StepTally` stands in front of a
:class:`ddp.flight.recorder.FlightRecorder` with its ``start``/``complete``/``fail``, passes
every call on, and keeps the gradient buckets' launch and completion times (``bucket`` set,
an allreduce or a comm hook) of the step in progress. Our wrapper's reducer calls it as its
recorder; torch's DDP calls it from the instrumentation's comm hook (:mod:`ddp.instrument.hook`).

Completions arrive on gloo's thread. Each bucket is one small list that only its completion
writes, and the step's list is swapped out whole when the step closes (on the main thread,
at the next step's forward, when the reducer has long waited for every bucket), so no lock is
needed beyond the recorder's own.
"""

from __future__ import annotations

import time
from typing import Any

from ddp.flight.recorder import FlightRecorder

__all__ = ["BUCKET_OPS", "StepTally"]

BUCKET_OPS = ("allreduce", "comm_hook")  # how our reducer and the hook name a bucket's collective


class StepTally:
    """Counts the buckets of the step in progress; every other attribute is the recorder's."""

    def __init__(self, recorder: FlightRecorder) -> None:
        self.recorder = recorder
        self._current: list[list[Any]] = []  # [launch, done | None, nbytes] per bucket
        self._by_seq: dict[int, list[Any]] = {}

    def start(self, op: str, *, step: int, bucket: int | None = None, nbytes: int = 0) -> int:
        seq = self.recorder.start(op, step=step, bucket=bucket, nbytes=nbytes)
        if bucket is not None and op in BUCKET_OPS:
            entry = [time.time(), None, nbytes]
            self._current.append(entry)
            self._by_seq[seq] = entry
        return seq

    def complete(self, seq: int) -> None:
        entry = self._by_seq.pop(seq, None)
        if entry is not None:
            entry[1] = time.time()
        self.recorder.complete(seq)

    def fail(self, seq: int, error: str) -> None:
        entry = self._by_seq.pop(seq, None)
        if entry is not None:
            entry[1] = time.time()
        self.recorder.fail(seq, error)

    def take(self) -> list[list[Any]]:
        """The buckets of the step that just ended, ``[launch, done | None, nbytes]`` each in
        launch order; the next step starts counting from nothing."""
        # _by_seq keeps any bucket still in flight: its completion fills in its entry.
        done, self._current = self._current, []
        return done

    def __getattr__(self, name: str) -> Any:
        # The rest of the recorder's interface (record, dump, watch, ...), unchanged.
        return getattr(self.recorder, name)
