"""The store's keys and the one message every rank reads: the quorum.

Everything the coordinator and the ranks tell each other goes through the coordinator's
``TCPStore`` under these keys; nothing else is shared. Torch-free, so the lab can read a quorum.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

__all__ = ["Quorum", "keys", "replica_of"]


class keys:
    """Key names. ``q`` is a quorum id, ``uid`` a member id (``<replica>.<incarnation>``)."""

    JOINED = "rec/joined"  # counter: registrations so far
    LIVENESS = "rec/liveness"  # the coordinator's port for members' connections (liveness)

    @staticmethod
    def joined(n: int) -> str:
        return f"rec/joined/{n}"  # the uid of the n-th registration

    @staticmethod
    def incarnation(replica: int) -> str:
        return f"rec/incarnation/{replica}"  # counter: how often this replica registered

    @staticmethod
    def heartbeat(uid: str) -> str:
        return f"rec/hb/{uid}"  # counter a live member keeps incrementing

    @staticmethod
    def quorum(q: int) -> str:
        return f"rec/quorum/{q}"  # the Quorum, as JSON; written once

    @staticmethod
    def notify(q: int) -> str:
        return f"rec/notify/{q}"  # why quorum q ends: {"kind": "abort"|"superseded", ...}

    @staticmethod
    def ready(q: int) -> str:
        return f"rec/ready/{q}"  # counter of members of q that left it after an abort

    @staticmethod
    def ready_uid(q: int, n: int) -> str:
        return f"rec/ready/{q}/{n}"

    @staticmethod
    def done(uid: str) -> str:
        return f"rec/done/{uid}"  # a member that finished training

    @staticmethod
    def history(q: int) -> str:
        return f"rec/history/{q}"  # the healer's per-step verdicts, for whoever heals in q

    @staticmethod
    def prefix(q: int) -> str:
        return f"rec/pg/{q}/"  # the gloo group of quorum q lives under this prefix


def replica_of(uid: str) -> int:
    """The replica (the rank a process was started as) of a member id."""
    return int(uid.split(".")[0])


def _order(uid: str) -> tuple[int, int]:
    replica, incarnation = uid.split(".")
    return int(replica), int(incarnation)


@dataclass(frozen=True)
class Quorum:
    """Who trains from now on. ``members`` are sorted by replica: a member's group rank is its
    index, so renumbering after a change is the same on every rank. ``refused`` says why
    training must stop instead (then ``members`` is empty)."""

    id: int
    members: tuple[str, ...] = ()
    reason: str = ""
    refused: str = ""
    lost: tuple[str, ...] = field(default=())
    joined: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "members", tuple(sorted(self.members, key=_order)))

    @property
    def world_size(self) -> int:
        return len(self.members)

    @property
    def replicas(self) -> list[int]:
        return [replica_of(u) for u in self.members]

    def group_rank(self, uid: str) -> int | None:
        return self.members.index(uid) if uid in self.members else None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> Quorum:
        data = json.loads(text)
        for name in ("members", "lost", "joined"):
            data[name] = tuple(data.get(name, ()))
        return cls(**data)
