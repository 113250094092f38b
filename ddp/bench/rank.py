"""One bench rank: build every variant, time them step by step, and tear down cleanly.

All variants live in the same processes and take turns step by step, so machine drift (the
other core busy, thermal, page cache) hits them alike; each round's figure per variant is the
median of its steps (the slowest rank's time per step), and the bench reports the median over
rounds.

Teardown order matters (see ``_teardown``): the bench used to abort now and then at exit with
``terminate called without an active exception`` (a rank killed by SIGABRT, no table printed).
"""

from __future__ import annotations

import gc
import importlib
import statistics
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ddp.flight.recorder import FlightRecorder
from ddp.program.config import Rendezvous
from ddp.wrapper.comm_hooks import register_named_hook
from ddp.wrapper.distributed import DistributedDataParallel

__all__ = ["VARIANTS", "measure"]

# "ours+rec": ours with the flight recorder attached, as `python -m ddp train` runs it: the price
# of recording every collective and its true completion time. "ours+hook": ours with torch's
# default allreduce comm hook registered, when our class has register_comm_hook. "ours+hier":
# ours with the hierarchical hook asked for by name, on one node (the bench's ranks share this
# host): it gathers the node names at construction, finds the topology flat and registers
# nothing, so its steps must cost what ours do.
VARIANTS = ("ours", "torch", "per-param", "no-sync", "ours+rec", "ours+hook", "ours+hier")
_OPTIONAL = {"ours+hook"}  # needs API our class may not have yet: skipped, not an error


def _mlp(depth: int, width: int) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _with_allreduce_hook(module: nn.Module) -> nn.Module:
    """Ours with torch's ``allreduce_hook``; raises if our class has no (working)
    ``register_comm_hook`` yet, which the caller reports as a skipped variant."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    model = DistributedDataParallel(module)
    register = getattr(model, "register_comm_hook", None)
    if register is None:
        raise NotImplementedError("ddp.DistributedDataParallel has no register_comm_hook")
    register(None, allreduce_hook)
    return model


def _wrap(name: str, module: nn.Module) -> nn.Module:
    if name == "ours":
        return DistributedDataParallel(module)
    if name == "torch":
        return nn.parallel.DistributedDataParallel(module)
    if name == "per-param":
        return DistributedDataParallel(module, bucket_cap_mb=0)
    if name == "ours+rec":
        recorder = FlightRecorder(dist.get_rank(), dist.get_world_size())
        return DistributedDataParallel(module, flight_recorder=recorder)
    if name == "ours+hook":
        return _with_allreduce_hook(module)
    if name == "ours+hier":
        model = DistributedDataParallel(module)
        assert register_named_hook(model, "hierarchical") is None  # one node: nothing registered
        return model
    return module  # no-sync: the bare module


def _step_fn(model: nn.Module, batch: int, width: int) -> Callable[[], None]:
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, width), torch.randn(batch, width)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.mse_loss(model(x), y).backward()
        opt.step()

    return step


def _build(
    cases: list[tuple[str, int]], cfg: dict[str, Any]
) -> tuple[dict[str, Callable[[], None]], dict[str, str]]:
    """Step functions by ``variant@batch`` key, and the optional variants skipped with why. A
    variant that fails to build fails the same way on every rank (same code, same model), so
    skipping it keeps the ranks' collectives paired; a required one failing is an error."""
    steps, skipped = {}, {}
    for variant, batch in cases:
        if variant in skipped:
            continue
        try:
            model = _wrap(variant, _mlp(cfg["depth"], cfg["width"]))
        except (AttributeError, NotImplementedError, TypeError) as e:
            if variant not in _OPTIONAL:
                raise
            skipped[variant] = f"{type(e).__name__}: {e}"
            continue
        steps[f"{variant}@{batch}"] = _step_fn(model, batch, cfg["width"])
    return steps, skipped


def _gloo_threads() -> int:
    """Live gloo threads of this process (worker run loops and the TCP event loop)."""
    tasks = Path("/proc/self/task")
    if not tasks.exists():
        return 0
    names = [(t / "comm").read_text().strip() for t in tasks.iterdir()]
    return sum(n.startswith(("pt_gloo", "gloo")) for n in names)


def _round_line(label: str, r: int, rounds: int, medians: dict[str, float]) -> str:
    figures = ", ".join(f"{k} {v:.2f} ms" for k, v in medians.items())
    return f"{label} round {r + 1}/{rounds}: {figures}"


def _teardown(steps: dict[str, Callable[[], None]]) -> int:
    """Release the process group so that its gloo threads are gone before the interpreter
    shuts down; returns how many gloo threads are left (0 when it worked).

    Why: ``destroy_process_group()`` only unregisters the group. Whatever else still references
    it keeps the C++ group, its two worker threads and the TCP event-loop thread running into
    interpreter shutdown, where they race with finalization, static destructors and the peers'
    sockets closing as they exit; now and then a rank died there with ``terminate called
    without an active exception`` (SIGABRT, no table). Two references did that in every rank:
    torch's DDP (its C++ reducer holds the group, and the Python object sits in a reference
    cycle, so only the garbage collector frees it) and ``torch._dynamo``'s import (see
    ``measure``). So: wait until no rank has a collective in flight, drop every model and
    collect the cycles while Python is fully alive, wait again so no rank closes its sockets
    while a peer still exchanges, then destroy the group; its destructor joins the threads.
    """
    dist.barrier()
    steps.clear()
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return _gloo_threads()


def _time_rounds(
    steps: dict[str, Callable[[], None]], cfg: dict[str, Any], rank: int
) -> dict[str, list[float]]:
    """Per-round medians in ms by key. Holds no reference to a model once it returns."""
    fns, keys = list(steps.values()), list(steps)
    per_round: dict[str, list[float]] = {k: [] for k in keys}
    for fn in fns:
        for _ in range(cfg["warmup"]):
            fn()
    for r in range(cfg["rounds"]):
        times = torch.zeros(len(fns), cfg["steps"], dtype=torch.float64)
        for i in range(cfg["steps"]):
            # Rotate who goes first: a variant that follows a big-batch one finds the caches
            # cold, and a fixed order would charge that to the same variant always.
            for k in range(len(fns)):
                j = (i + k) % len(fns)
                dist.barrier()  # start together: a step is as slow as its slowest rank
                t0 = time.perf_counter()
                fns[j]()
                times[j, i] = time.perf_counter() - t0
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        medians = {k: statistics.median(times[j].tolist()) * 1e3 for j, k in enumerate(keys)}
        for k, v in medians.items():
            per_round[k].append(v)
        if rank == 0:
            print(_round_line(cfg["label"], r, cfg["rounds"], medians), flush=True)
    return per_round


def measure(rdzv: Rendezvous, cfg: dict[str, Any]) -> dict[str, Any]:
    """Time the variants in ``cfg["variants"]`` at ``cfg["batch"]`` (and ours/no-sync at each of
    ``cfg["share_batches"]``). Rank 0 returns per-round medians in ms by ``variant@batch`` and
    the skipped variants; every rank returns how many gloo threads outlived the teardown.
    Prints one progress line per round on rank 0."""
    torch.set_num_threads(1)
    # torch.optim and torch's DDP import torch._dynamo lazily; imported while a group exists, it
    # keeps a C++ reference to that group past destroy_process_group() (and its gloo threads
    # alive into interpreter shutdown). Imported before the group exists, it takes none.
    importlib.import_module("torch._dynamo")
    dist.init_process_group(
        "gloo",
        init_method=rdzv.init_method,
        rank=rdzv.rank,
        world_size=rdzv.world_size,
        timeout=timedelta(seconds=cfg["collective_timeout"]),
    )
    steps: dict[str, Callable[[], None]] = {}
    try:
        cases = [(v, cfg["batch"]) for v in cfg["variants"]]
        cases += [(v, b) for b in cfg["share_batches"] for v in ("ours", "no-sync")]
        steps, skipped = _build(cases, cfg)
        for variant, why in skipped.items():
            if rdzv.rank == 0:
                print(f"{cfg['label']}: skipping {variant} ({why})", flush=True)
        per_round = _time_rounds(steps, cfg, rdzv.rank)
        left = _teardown(steps)
        if left:
            print(f"rank {rdzv.rank}: {left} gloo threads still alive after teardown", flush=True)
        if rdzv.rank != 0:
            return {"gloo_threads_left": left}
        return {"per_round_ms": per_round, "skipped": skipped, "gloo_threads_left": left}
    finally:
        if dist.is_initialized():  # an error above: still release the group before exit
            steps.clear()
            gc.collect()
            dist.destroy_process_group()
