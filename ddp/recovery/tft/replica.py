"""What one torchft replica trains and where it stands, and the state torchft moves when it
heals a peer: the weights, the optimizer state (SGD momentum) and the per-step history, so a
healed replica can account for the steps it did not run itself."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ddp.recovery.job import ReplicaJob
from ddp.recovery.records import FaultRecord, HealRecord, QuorumRecord
from ddp.recovery.tft.parts import state_bytes

__all__ = ["Replica"]


@dataclass
class Replica(ReplicaJob):
    manager: Any = None  # torchft.manager.Manager
    pg: Any = None  # ddp.recovery.tft.parts.WatchedGloo
    transport: Any = None  # ddp.recovery.tft.parts.WatchedTransport
    store: Any = None
    registered_t: float = 0.0  # when the manager joined the lighthouse
    noticed_t: float | None = None  # when this step's allreduce first failed
    noticed: bool = False  # a fault record was written in the current quorum
    quorum_id: int = -1
    members: list[int] | None = None
    history: list[dict] = field(default_factory=list)
    failed: int = 0
    quorums: int = 0

    def state_dict(self) -> dict[str, Any]:
        """What a healthy replica serves to one that heals (torchft calls it)."""
        return {
            "model": self.module.state_dict(),
            "optim": self.opt.state_dict(),
            "history": list(self.history),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A peer's state, received by torchft inside ``start_quorum``: adopt it, and record
        the heal."""
        self.module.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optim"])
        self.history = list(state["history"])
        got, members = self.transport.received, self.pg.configured.members
        src = members[got.src_replica_rank] if got else -1
        self.jlog.write(
            HealRecord(
                self.replica,
                self.pg.configured.quorum_id,
                self.manager.current_step(),
                src,
                state_bytes(state),
                got.seconds if got else 0.0,
                time.time(),
                self.registered_t,
                self.started_t,
            )
        )

    def note_quorum(self) -> None:
        """After ``start_quorum``: a quorum record when torchft reconfigured the group."""
        c = self.pg.configured
        if c is None or c.quorum_id == self.quorum_id:
            return
        before = self.members
        lost = sorted(set(before or []) - set(c.members))
        joined = sorted(set(c.members) - set(before or c.members))
        if before is None and c.quorum_id <= 1:  # torchft's lighthouse counts from 1
            reason = f"all {len(c.members)} replicas"
        elif before is None:
            reason, joined = f"rank {self.replica} joined", [self.replica]
        else:
            parts = [f"lost rank {x}" for x in lost] + [f"rank {x} joined" for x in joined]
            reason = "; ".join(parts) or "same members"
        if lost and not self.noticed:
            # No collective of this replica failed: the loss showed only as a quorum without
            # the lost replica (it never asked for one; the lighthouse waited --join_timeout_ms).
            why = f"quorum {c.quorum_id} formed without rank {', '.join(map(str, lost))}"
            step = self.manager.current_step() + 1
            self.jlog.write(FaultRecord(self.replica, self.quorum_id, step, c.t, "lighthouse", why))
        self.noticed = False
        self.quorum_id, self.members = c.quorum_id, list(c.members)
        self.quorums += 1
        self.jlog.write(
            QuorumRecord(
                self.replica,
                c.quorum_id,
                list(c.members),
                len(c.members),
                c.replica_rank,
                c.t,
                reason,
                lost,
                joined,
                None,
            )
        )
