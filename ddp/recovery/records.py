"""The typed records of a live run, in the shape of ``ddp.program.records`` and read by its one
reader (which looks them up in ``KINDS``): every event of the recovery timeline is one record,
so the lab prints the timeline and judges the run from data. ``rank`` is always the replica
(the ``--rank`` a process was started as; a replacement keeps it and writes
``rank<R>.attempt<N>.jsonl``); ``t`` is the wall clock (ranks of one host, or containers of one
host, share it).

Torch-free, and free of the demo program: they derive from ``ddp.record.Record``, so any loop
that uses ``ddp.recovery.api`` can write these records to its own log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ddp.record import Record

__all__ = [
    "KINDS",
    "CommitRecord",
    "DeciderRecord",
    "FaultRecord",
    "HealRecord",
    "QuorumRecord",
    "Record",
    "RecoveryVerdictRecord",
]


@dataclass
class FaultRecord(Record):
    """This rank noticed that quorum ``quorum_id`` failed during ``step``: ``source`` is who
    noticed first (``self``: this rank's own collective failed or timed out; ``rank R``: a
    peer posted the abort; ``coordinator``: a member's heartbeats stopped), ``why`` the cause."""

    event: ClassVar[str] = "fault"
    quorum_id: int
    step: int
    t: float
    source: str
    why: str


@dataclass
class QuorumRecord(Record):
    """This rank entered quorum ``quorum_id``: its members (replicas, in group-rank order),
    its own group rank, and who holds the single-process reference from now on (None: not
    run)."""

    event: ClassVar[str] = "quorum"
    quorum_id: int
    members: list[int]
    world_size: int
    group_rank: int
    t: float
    reason: str = ""
    lost: list[int] = field(default_factory=list)
    joined: list[int] = field(default_factory=list)
    reference_rank: int | None = None


@dataclass
class CommitRecord(Record):
    """Step ``step`` in quorum ``quorum_id``: committed (every member voted yes and this rank
    applied the optimizer step) or failed (no optimizer step; it is redone in the next
    quorum), with ``reason``. ``params_sha256``: the sha256 of the state the step was computed
    from (the loop's state_dict before the update), so that a reader can tell whether every
    member that committed it started from the same weights (None: not committed, or not asked
    for with ``--commit-digests``)."""

    event: ClassVar[str] = "commit"
    step: int
    quorum_id: int
    world_size: int
    committed: bool
    t: float
    reason: str = ""
    params_sha256: str | None = None


@dataclass
class HealRecord(Record):
    """This rank received the state of step ``step`` from replica ``from_rank``: ``nbytes``
    in ``seconds``; ``registered_t`` is when this process registered with the coordinator,
    ``started_t`` when it started (interpreter and torch import come before registering)."""

    event: ClassVar[str] = "heal"
    quorum_id: int
    step: int
    from_rank: int
    nbytes: int
    seconds: float
    t: float
    registered_t: float
    started_t: float


@dataclass
class DeciderRecord(Record):
    """This rank took the role that decides quorums (``ddp.recovery.etcd.decider``): its
    holder, the launcher's decider or another member, was lost or stalled past its lease.
    ``quorum_id`` is the newest quorum then; the lab judges a decider's loss survived only
    when a member took the role after it."""

    event: ClassVar[str] = "decider"
    quorum_id: int
    t: float


@dataclass
class RecoveryVerdictRecord(Record):
    """The end of a live run, by every member of the last quorum: did the replicas agree
    bitwise after every committed step, was every step 1..steps committed exactly once, and
    was parity against the single-process reference judged (and held) on how many steps."""

    event: ClassVar[str] = "recovery_verdict"
    holds: bool
    committed_steps: int
    expected_steps: int
    failed_attempts: int
    quorums: int
    judged_steps: int
    message: str


KINDS: dict[str, type[Record]] = {
    k.event: k
    for k in (
        FaultRecord,
        QuorumRecord,
        CommitRecord,
        HealRecord,
        DeciderRecord,
        RecoveryVerdictRecord,
    )
}
