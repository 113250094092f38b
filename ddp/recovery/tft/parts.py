"""torchft's pieces, each watched so that a replica can write our typed records: the gloo
group tells when and into which quorum it was reconfigured, the checkpoint transport how long
a heal's transfer took. Both are torchft's public classes, subclassed; nothing of torchft's
behaviour changes.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torchft.checkpointing import HTTPTransport
from torchft.process_group import ProcessGroupGloo

__all__ = ["Configured", "Received", "WatchedGloo", "WatchedTransport", "state_bytes"]


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
