"""Launching N local ranks with ``torch.multiprocessing`` (spawn) on a fresh file:// rendezvous.

Lives in its own module, not in ``__main__``: spawned children re-import the target function by
its module path, which ``python -m ddp``'s ``__main__`` does not have.
"""

from __future__ import annotations

import gc
import importlib
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp

from ddp.program.config import Rendezvous, TrainConfig
from ddp.program.logs import setup_logging
from ddp.program.outcome import RankExit, run_guarded
from ddp.program.train import run_rank
from ddp.wrapper.topology import NODE_ENV

__all__ = ["spawn_local", "spawn_ranks"]


def _child(
    rank: int, fn: Callable[..., Any], world: int, init: str, results: Any, args: tuple
) -> None:
    # Ranks share the host's cores; intra-op threads of 4 ranks on 2 cores would fight.
    os.environ["OMP_NUM_THREADS"] = "1"
    # Before any process group exists: imported later (torch.optim and torch's DDP do it
    # lazily), torch._dynamo keeps the group, and gloo's threads, alive into interpreter
    # shutdown, where they abort the process now and then (see ddp.program.train.run_rank).
    importlib.import_module("torch._dynamo")
    result = fn(Rendezvous(rank=rank, world_size=world, init_method=init), *args)
    # What fn built may still hold its process group through reference cycles (a wrapper's
    # hooks, a Join context): collect them now, so gloo's threads stop before interpreter
    # shutdown instead of aborting it ("terminate called without an active exception").
    gc.collect()
    results.put((rank, result))
    if isinstance(result, RankExit) and result.code >= 2:
        # Exit as failed, so that torch's spawn ends the peers now instead of letting them
        # wait out the collective timeout; the message already went through the queue.
        sys.exit(result.code)


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
    raises or dies ends the others (torch's spawn terminates them) and its error is re-raised,
    with what the ranks returned before that as its ``results`` attribute.
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
    got: dict[int, Any] = {}

    def drain() -> None:
        # Read while the ranks run: a result larger than the pipe's buffer (64 KiB) blocks
        # its rank in put() until someone reads, and a rank blocked there never exits.
        while not results.empty():
            rank, value = results.get()
            got[rank] = value

    try:
        while not procs.join(timeout=1.0):
            drain()
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{world_size} ranks did not finish within {timeout_s:.0f} s")
        drain()
        assert len(got) == world_size, f"every rank that exited 0 put its result: {sorted(got)}"
        return got
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
        drain()
        e.results = got  # type: ignore[attr-defined]
        raise
    finally:
        for p in procs.processes:
            if p.is_alive():
                p.kill()
            p.join(timeout=5)
        shutil.rmtree(tmp, ignore_errors=True)
        # torch's spawn leaves a pickled traceback in /tmp for every rank that raised.
        for path in getattr(procs, "error_files", ()):
            if path:
                Path(path).unlink(missing_ok=True)


def _train_rank(rdzv: Rendezvous, cfg: TrainConfig) -> RankExit:
    if cfg.nodes > 1:  # before any process group: the hierarchical hook gathers the names
        os.environ[NODE_ENV] = cfg.node_of(rdzv.rank, rdzv.world_size)
    setup_logging(rdzv.rank, cfg.log_all_ranks)
    return run_guarded(rdzv.rank, cfg.log_dir, lambda: run_rank(cfg, rdzv))


def _worst(exits: dict[int, RankExit]) -> RankExit:
    """The run's outcome: the most severe rank's (internal error, then a lost peer, then bad
    input, then parity broken), with the lowest such rank's message."""
    severity = {4: 4, 3: 3, 2: 2, 1: 1, 0: 0}
    return max(sorted(exits.items()), key=lambda kv: severity.get(kv[1].code, 4))[1]


def spawn_local(cfg: TrainConfig, world_size: int) -> RankExit:
    """Train ``world_size`` local ranks; the run's exit code and final line."""
    cfg.local_batch(world_size)  # fail on a bad split before spawning anything
    cfg.node_of(0, world_size)  # and on --nodes that do not divide the world
    # torch's spawn warns for every peer it stops after a failure; the outcome says it once.
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    try:
        return _worst(spawn_ranks(_train_rank, world_size, cfg))
    except mp.ProcessExitedException as e:
        exits: dict[int, RankExit] = getattr(e, "results", {})
        if any(x.code >= 2 for x in exits.values()):
            return _worst(exits)
        how = f"was killed by {e.signal_name}" if e.signal_name else f"exited {e.exit_code}"
        return RankExit(3, f"diagnosis: rank {e.error_index} {how} and the run was stopped")
