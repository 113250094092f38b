"""Launching N local ranks with ``torch.multiprocessing`` (spawn) on a fresh file:// rendezvous.

Lives in its own module, not in ``__main__``: spawned children re-import the target function by
its module path, which ``python -m ddp``'s ``__main__`` does not have.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

from ddp.config import Rendezvous, TrainConfig
from ddp.logs import setup_logging
from ddp.train import run_rank

__all__ = ["spawn_local", "spawn_ranks"]


def _child(
    rank: int, fn: Callable[..., Any], world: int, init: str, results: Any, args: tuple
) -> None:
    # Ranks share the host's cores; intra-op threads of 4 ranks on 2 cores would fight.
    os.environ["OMP_NUM_THREADS"] = "1"
    results.put((rank, fn(Rendezvous(rank=rank, world_size=world, init_method=init), *args)))


def spawn_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    rendezvous_dir: str | None = None,
    timeout_s: float | None = None,
) -> dict[int, Any]:
    """Run ``fn(rendezvous, *args)`` in ``world_size`` spawned processes; return each rank's
    result (``fn`` must be importable by module path, and so must its result be picklable).

    A fresh rendezvous file per call: gloo's FileStore reuses a stale file and hangs. A rank that
    raises or dies ends the others (torch's spawn terminates them) and its error is re-raised.
    ``timeout_s`` bounds the whole run: past it every rank is killed and TimeoutError raised.
    """
    tmp = tempfile.mkdtemp(prefix="ddp-rdzv-", dir=rendezvous_dir)
    results = mp.get_context("spawn").SimpleQueue()
    procs = mp.start_processes(
        _child,
        args=(fn, world_size, f"file://{tmp}/rdzv", results, args),
        nprocs=world_size,
        join=False,
        start_method="spawn",
    )
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while not procs.join(timeout=1.0):
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{world_size} ranks did not finish within {timeout_s:.0f} s")
        return dict(results.get() for _ in range(world_size))
    finally:
        for p in procs.processes:
            if p.is_alive():
                p.kill()
            p.join(timeout=5)
        shutil.rmtree(tmp, ignore_errors=True)


def _train_rank(rdzv: Rendezvous, cfg: TrainConfig) -> bool:
    setup_logging(rdzv.rank, cfg.log_all_ranks)
    return run_rank(cfg, rdzv)


def spawn_local(cfg: TrainConfig, world_size: int) -> bool:
    """Train ``world_size`` local ranks; True iff parity holds."""
    cfg.local_batch(world_size)  # fail on a bad split before spawning anything
    return all(spawn_ranks(_train_rank, world_size, cfg).values())
