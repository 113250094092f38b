"""Joining the other ranks: a store every rank checks in with before the process group exists.

``init_process_group`` on a file:// or tcp:// rendezvous waits for every rank and, when one
never comes, fails after the timeout with a bare ``Wait timeout`` that names nobody. So each
rank first writes ``ddp/joined/<rank>`` into the store and waits for everyone's key; on timeout
the keys that are missing are the ranks that never joined, and the error says so, with the
rendezvous. The same store then backs the process group. A file that already holds this rank's
key is left over from an earlier run (gloo would hang or fail on its stale addresses): that is
bad input, refused before anything waits. env:// (torchrun) has already rendezvoused in its
agent, so it goes to ``init_process_group`` as it is.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from urllib.parse import urlparse

import torch.distributed as dist

from ddp.flight.diagnosis import PeerFailure
from ddp.program.config import Rendezvous
from ddp.program.outcome import BadInput

__all__ = ["CannotOpen", "NeverJoined", "StaleRendezvous", "check_reachable", "join"]


class NeverJoined(PeerFailure):
    """Some ranks never checked in with the rendezvous within the timeout."""


class StaleRendezvous(BadInput):
    """A file:// rendezvous left by an earlier run."""


class CannotOpen(BadInput):
    """Rank 0 could not listen at the tcp:// rendezvous (the port in use, a foreign address)."""


def _key(rank: int) -> str:
    return f"ddp/joined/{rank}"


def check_reachable(rdzv: Rendezvous) -> None:
    """Bad input, before anything waits: a file:// rendezvous whose directory is missing or
    not writable, or a tcp:// URL without host and port."""
    url = urlparse(rdzv.init_method)
    if url.scheme == "file":
        parent = Path(url.path).parent
        if not parent.is_dir():
            raise ValueError(
                f"--init-method {rdzv.init_method}: directory {parent} does not exist; create "
                "it on a filesystem every rank shares"
            )
        if not (parent.stat().st_mode & 0o222) or not _writable(parent):
            raise ValueError(f"--init-method {rdzv.init_method}: cannot write in {parent}")
    elif url.scheme == "tcp" and (not url.hostname or not url.port):
        raise ValueError(f"--init-method {rdzv.init_method}: expected tcp://HOST:PORT")


def _writable(directory: Path) -> bool:
    import os

    return os.access(directory, os.W_OK | os.X_OK)


def _tcp_store(
    rdzv: Rendezvous, host: str, port: int, timeout: timedelta, timeout_s: float
) -> dist.Store:
    """Rank 0 opens the store without waiting for the others (so a rank that never comes is
    named below by its missing key, not blamed on rank 0); the others connect to it."""
    try:
        return dist.TCPStore(
            host, port, rdzv.world_size, rdzv.rank == 0, timeout=timeout, wait_for_workers=False
        )
    except RuntimeError as e:  # DistNetworkError: could not listen, or no server reached
        why = str(e).splitlines()[0][:120]
        if rdzv.rank == 0:
            raise CannotOpen(
                f"--init-method {rdzv.init_method}: rank 0 could not open the rendezvous "
                f"there ({why}): is the port in use, or the address not this host's?"
            ) from None
        raise NeverJoined(
            f"diagnosis: rank {rdzv.rank} could not reach the rendezvous {rdzv.init_method} "
            f"within {timeout_s:g} s ({why}): rank 0 is not listening there, or this rank's "
            "host has no route to rank 0's",
            [0],
        ) from None


def join(rdzv: Rendezvous, timeout_s: float) -> dist.Store | None:
    """Check in and wait for every rank; the store for ``init_process_group``, or None for
    env:// (use ``init_method`` then). Raises ``NeverJoined`` naming the missing ranks."""
    url = urlparse(rdzv.init_method)
    timeout = timedelta(seconds=timeout_s)
    if url.scheme == "file":
        store = dist.FileStore(url.path, rdzv.world_size)
        store.set_timeout(timeout)
        if store.check([_key(rdzv.rank)]):
            raise StaleRendezvous(
                f"--init-method {rdzv.init_method} is left over from an earlier run (rank "
                f"{rdzv.rank} is already in it): delete {url.path} or pass a fresh path"
            )
    elif url.scheme == "tcp":
        store = _tcp_store(rdzv, url.hostname, url.port, timeout, timeout_s)
    else:
        return None
    store.set(_key(rdzv.rank), "1")
    everyone = [_key(r) for r in range(rdzv.world_size)]
    try:
        store.wait(everyone, timeout)
    except RuntimeError:
        missing = [r for r in range(rdzv.world_size) if not store.check([_key(r)])]
        if not missing:
            raise  # everyone is there after all: not a missing peer
        if url.scheme == "file":
            # The run is over for whoever joined; a next run needs a fresh file anyway.
            del store
            Path(url.path).unlink(missing_ok=True)
        who = ", ".join(map(str, missing))
        raise NeverJoined(
            f"diagnosis: rank{'s' if len(missing) > 1 else ''} {who} never joined the "
            f"rendezvous {rdzv.init_method} within {timeout_s:g} s "
            f"({rdzv.world_size - len(missing)} of {rdzv.world_size} ranks arrived)",
            missing,
        ) from None
    return store
