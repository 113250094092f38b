"""Name the rank that stalled a job, from the flight recorder dumps of all ranks.

Collectives are issued in the same order on every rank, so sequence number `s` means the same
collective everywhere. A collective can complete on a rank only after every rank joined it, so:

- a sequence number completed on *any* rank was reached by all ranks;
- the stuck collective is the lowest sequence number that some rank started and no rank
  completed;
- the missing ranks are those that never started it: either their dump says their last
  started sequence number is lower, or they left no dump at all (a SIGKILLed or stopped
  process cannot write one).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from ddp.flight.dumps import load_dumps, request_dumps
from ddp.flight.gloo_errors import error_meaning
from ddp.flight.recorder import FlightRecorder

__all__ = ["Diagnosis", "PeerFailure", "diagnose", "explain_failure", "wait_for_dumps"]

log = logging.getLogger(__name__)


@dataclass
class Diagnosis:
    """Who never arrived at which collective, and how long the survivors waited for it."""

    missing_ranks: list[int]  # ranks that never arrived at the stuck collective
    stuck_seq: int | None
    step: int | None
    bucket: int | None
    op: str | None
    noticed: dict[int, float]  # survivor rank -> seconds from the stuck collective's start to
    # its failure (or to the dump when no failure was recorded)
    without_dump: list[int] = field(default_factory=list)  # ranks that wrote no dump
    waiting: list[int] = field(default_factory=list)  # ranks still blocked in the stuck
    # collective when asked to dump (reason "requested"): alive, arrived, not yet failed
    late: list[int] = field(default_factory=list)  # alive (answered a dump request) but not
    # yet at the stuck collective when asked: slow, not gone

    def summary(self) -> str:
        """One line, e.g. `rank 2 missing at step 5 (allreduce of bucket 3, seq 41);
        ranks 0,1,3 noticed after 30.4 s`."""
        if self.stuck_seq is None:
            text = "no stuck collective: every recorded collective completed"
            if self.without_dump:
                text += f"; no dump from {_ranks(self.without_dump)}"
            return text
        where = f"step {self.step}" if self.step is not None and self.step >= 0 else "setup"
        what = self.op or "collective"
        if self.bucket is not None:
            what += f" of bucket {self.bucket}"
        what += f", seq {self.stuck_seq}"
        if self.missing_ranks:
            head = f"{_ranks(self.missing_ranks)} missing at {where} ({what})"
        else:
            # Everyone arrived yet nobody finished: the ranks cannot reach each other.
            head = f"all ranks arrived at {where} ({what}) but it never completed (network?)"
        if self.noticed:
            times = sorted(self.noticed.values())
            lo, hi = _secs(times[0]), _secs(times[-1])
            span = lo if lo == hi else f"{lo}-{hi}"
            head += f"; {_ranks(sorted(self.noticed))} noticed after {span} s"
        if self.waiting:
            head += f"; {_ranks(self.waiting)} still waiting"
        if self.late:
            head += f"; {_ranks(self.late)} alive but not there yet"
        return head


def _secs(s: float) -> str:
    # A killed peer is noticed in milliseconds: "0.0 s" would read as "not measured".
    return f"{s:.2f}" if s < 1 else f"{s:.1f}"


def _ranks(ranks: list[int]) -> str:
    word = "rank" if len(ranks) == 1 else "ranks"
    return f"{word} {','.join(str(r) for r in ranks)}"


def diagnose(dumps: dict[int, dict], world_size: int) -> Diagnosis:
    """Compare the dumps (rank -> dump as written by `FlightRecorder.dump`) of a failed job.

    Works with any subset of ranks: a rank without a dump counts as not having arrived.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    out_of_range = sorted(r for r in dumps if not 0 <= r < world_size)
    if out_of_range:
        raise ValueError(f"dumps from ranks {out_of_range} outside world_size {world_size}")

    completed: set[int] = set()
    pending: dict[int, list[tuple[int, dict]]] = {}  # seq -> [(rank, record)]
    for rank, dump in dumps.items():
        for rec in dump["records"]:
            if rec.get("state") == "completed":
                completed.add(rec["seq"])
            else:
                pending.setdefault(rec["seq"], []).append((rank, rec))
    without_dump = [r for r in range(world_size) if r not in dumps]
    stuck = [s for s in pending if s not in completed]
    if not stuck:
        return Diagnosis([], None, None, None, None, {}, without_dump)

    seq = min(stuck)
    arrived = dict(pending[seq])  # rank -> its record of the stuck collective
    first = arrived[min(arrived)]
    behind = [r for r in range(world_size) if r not in arrived]
    # A rank that answered a dump request is alive: if it has not reached the stuck
    # collective yet it is late (e.g. still writing a checkpoint), not missing.
    late = [r for r in behind if r in dumps and dumps[r].get("reason") == "requested"]
    missing = [r for r in behind if r not in late]
    noticed, waiting = {}, []
    for rank, rec in sorted(arrived.items()):
        if rec.get("state") == "failed" and rec.get("end"):
            noticed[rank] = max(0.0, rec["end"] - rec["start"])
        elif dumps[rank].get("reason") == "requested":
            waiting.append(rank)
        else:
            noticed[rank] = max(0.0, dumps[rank]["time"] - rec["start"])
    return Diagnosis(
        missing_ranks=missing,
        stuck_seq=seq,
        step=first.get("step"),
        bucket=first.get("bucket"),
        op=first.get("op"),
        noticed=noticed,
        without_dump=without_dump,
        waiting=waiting,
        late=late,
    )


def wait_for_dumps(
    directory: Path,
    world_size: int,
    *,
    grace_s: float,
    newer_than: float | None = None,
    poll_s: float = 0.05,
    request: bool = True,
    rank: int | None = None,
) -> dict[int, dict]:
    """Ask the other ranks to dump, wait up to `grace_s` s for all `world_size` dumps, return them.

    With `request` (the default) this first calls `request_dumps`, so every rank that is
    alive and `watch`ing answers within its poll interval, even one still blocked inside the
    stuck collective; a grace of a second or two then suffices whatever the collective timeout.
    Ranks that were killed or stopped never answer, so the wait is bounded and the diagnosis
    is made with whatever arrived. Without watchers, grace_s must exceed the collective
    timeout, or survivors still blocked would be taken for missing. Pass `newer_than` (e.g.
    the run's start time) when the directory may hold dumps of an earlier run; `rank` only
    labels the request.
    """
    if grace_s < 0:
        raise ValueError(f"grace_s must be >= 0, got {grace_s}")
    if request:
        request_dumps(directory, rank)
    deadline = time.monotonic() + grace_s
    while True:
        dumps = load_dumps(directory, newer_than=newer_than)
        if len(dumps) >= world_size or time.monotonic() >= deadline:
            break
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
    if len(dumps) < world_size:
        absent = sorted(set(range(world_size)) - set(dumps))
        log.info("no flight recorder dump from ranks %s after %.1f s", absent, grace_s)
    return dumps


class PeerFailure(RuntimeError):
    """A collective failed because another rank died, stalled or was cut off. The message is
    the diagnosis (who never arrived, at which step and bucket), not gloo's bare error."""

    def __init__(self, message: str, missing_ranks: list[int] | None = None) -> None:
        super().__init__(message)
        self.missing_ranks = list(missing_ranks or [])


def explain_failure(
    error: BaseException,
    recorder: FlightRecorder,
    directory: Path | None,
    *,
    newer_than: float,
    grace_s: float = 2.0,
) -> PeerFailure:
    """Dump this rank's records, gather the others' and turn ``error`` into a diagnosis.

    ``directory`` must be shared by all ranks (the log volume); without one, only this rank's
    view is known and the message says how to get a full diagnosis.
    """
    gloo = error_meaning(str(error)) or type(error).__name__
    if directory is None:
        return PeerFailure(
            f"diagnosis unavailable: a collective failed ({gloo}); pass --log-dir on a "
            "filesystem all ranks share so the flight recorders can name the missing rank"
        )
    reason = "timeout" if "timed out" in str(error).lower() else "error"
    try:
        recorder.dump(directory, reason)
        dumps = wait_for_dumps(
            directory,
            recorder.world_size,
            grace_s=grace_s,
            newer_than=newer_than,
            rank=recorder.rank,
        )
    except OSError as e:  # the shared volume failing us must not hide the original failure
        return PeerFailure(f"diagnosis unavailable: a collective failed ({gloo}); {e}")
    diag = diagnose(dumps, recorder.world_size)
    return PeerFailure(f"diagnosis: {diag.summary()} ({gloo})", diag.missing_ranks)
