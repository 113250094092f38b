"""One torchft replica: what it trains and where it stands, the state torchft moves when it
heals a peer (the weights, the optimizer state and the per-step history, so a healed replica
can account for the steps it did not run itself), and torchft's pieces it runs with.

Those pieces are torchft's public classes, subclassed and watched so that the replica can write
our typed records (nothing of torchft's behaviour changes): the gloo group tells when and into
which quorum it was reconfigured, the checkpoint transport how long a heal's transfer took.
Our wrapper is driven through its comm-hook path (``manager_allreduce_hook``), as
``torchft.ddp`` drives torch's: each gradient bucket is averaged by ``Manager.allreduce`` over
the current quorum's group.

No ``from __future__ import annotations``: the wrapper, like torch's, compares the hook's
annotations with ``dist.GradBucket`` and ``Future[Tensor]`` objects.
"""

import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torchft.checkpointing import HTTPTransport
from torchft.process_group import ProcessGroupGloo

from ddp.recovery.demo.job import ReplicaJob
from ddp.recovery.records import FaultRecord, HealRecord, QuorumRecord

__all__ = [
    "Configured",
    "Received",
    "Replica",
    "WatchedGloo",
    "WatchedTransport",
    "manager_allreduce_hook",
    "state_bytes",
]


@dataclass(frozen=True)
class Configured:
    """One reconfiguration: the quorum's id, the replicas (``--rank`` of each) in replica-rank
    order, this replica's rank in it, and when."""

    quorum_id: int
    members: list[int]
    replica_rank: int
    t: float


@dataclass(frozen=True)
class Received:
    """One heal's transfer: from which replica rank of the quorum, its seconds, when it ended."""

    src_replica_rank: int
    seconds: float
    t: float


class WatchedGloo(ProcessGroupGloo):
    """torchft's reconfigurable gloo group; ``configured`` is its newest quorum."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.configured: Configured | None = None

    def configure(
        self,
        store_addr: str,
        replica_id: str,
        rank: int,
        world_size: int,
        quorum_id: int | None = None,
        group_rank: int | None = None,
        group_world_size: int | None = None,
        global_ranks: list[int] | None = None,
    ) -> None:
        super().configure(
            store_addr,
            replica_id,
            rank,
            world_size,
            quorum_id,
            group_rank,
            group_world_size,
            global_ranks,
        )
        # One rank per replica group: the manager's global ranks are the replicas' --rank.
        members = list(global_ranks or [])
        self.configured = Configured(int(quorum_id or 0), members, rank, time.time())


class WatchedTransport(HTTPTransport):
    """torchft's HTTP checkpoint transport; ``received`` is the newest heal's transfer. It
    advertises ``host`` (torchft's: this machine's hostname), and its server does not log
    each request to stderr (the heal record says it)."""

    def __init__(self, host: str, *args: Any, **kwargs: Any) -> None:
        self.host = host
        super().__init__(*args, **kwargs)
        self.received: Received | None = None
        handler = self._server.RequestHandlerClass
        quiet = type("QuietHandler", (handler,), {"log_message": lambda *_: None})
        self._server.RequestHandlerClass = quiet

    def address(self) -> str:
        return f"http://{self.host}:{self._server.socket.getsockname()[1]}/checkpoint/"

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: Any) -> Any:
        t0 = time.perf_counter()
        with warnings.catch_warnings():  # torch's loader, about the bytes it reads from
            warnings.filterwarnings("ignore", "The given buffer is not writable")
            state = super().recv_checkpoint(src_rank, metadata, step, timeout)
        self.received = Received(src_rank, time.perf_counter() - t0, time.time())
        return state


def state_bytes(state: Any) -> int:
    """Bytes of every tensor in a nested state dict (what a heal moved)."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(v) for v in state)
    return 0


def manager_allreduce_hook(
    state: Any, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """``state`` is a ``Replica``. The manager averages over the replicas taking part (a replica
    healing this step contributes zeros) and never raises: a failed allreduce is reported to it
    (``errored()``) and the step will not commit. Its averaging callback runs only once the work is
    waited on, so the hook waits here (as torchft.ddp's does); the buckets are then reduced one
    after the other."""
    manager = state.manager
    buf = bucket.buffer()
    manager.allreduce(buf).wait()
    if manager.errored() is not None and state.noticed_t is None:
        state.noticed_t = time.time()
    done = torch.futures.Future()
    done.set_result(buf)
    return done


@dataclass
class Replica(ReplicaJob):
    manager: Any = None  # torchft.manager.Manager
    pg: Any = None  # WatchedGloo
    transport: Any = None  # WatchedTransport
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
