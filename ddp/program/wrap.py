"""Which DistributedDataParallel a run trains with, and the line that says so.

``--wrapper ours`` builds this project's wrapper; ``--wrapper torch`` builds torch's on the same
module, data and rendezvous, so every comparison with torch (the lab's ``topology`` experiment)
differs in the wrapper alone. ``--sync barrier / none`` trains the bare module.
"""

from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from ddp.flight.recorder import FlightRecorder
from ddp.program.config import TrainConfig
from ddp.wrapper.buckets import torch_caps, torch_initial_plan
from ddp.wrapper.comm_hooks import register_named_hook
from ddp.wrapper.distributed import DistributedDataParallel
from ddp.wrapper.hierarchical import HierarchicalState

__all__ = ["bucket_count", "start_line", "wrap"]


def wrap(
    cfg: TrainConfig, module: nn.Module, recorder: FlightRecorder, bucket_order: list[int] | None
) -> tuple[nn.Module, object | None]:
    """``--sync allreduce``: the chosen wrapper, with its comm hook and (ours) a resumed run's
    bucket order, and the state the hook was registered with (``HierarchicalState`` for a
    two-level allreduce that registered, else None). ``--sync barrier / none``: the module
    itself (same loop, no averaging)."""
    if cfg.sync != "allreduce":
        return module, None
    find_unused = cfg.finds_unused
    if cfg.wrapper == "torch":
        # torch rebuilds its buckets in its own first backward; a checkpoint's order is ours
        model: nn.Module = TorchDDP(
            module, bucket_cap_mb=cfg.bucket_cap_mb, find_unused_parameters=find_unused
        )
    else:
        model = DistributedDataParallel(
            module,
            bucket_cap_mb=cfg.bucket_cap_mb,
            overlap=cfg.overlap,
            find_unused_parameters=find_unused,
            flight_recorder=recorder,
        )
    state = register_named_hook(model, cfg.comm_hook) if cfg.comm_hook != "none" else None
    if bucket_order is not None and isinstance(model, DistributedDataParallel):
        model.restore_bucket_order(bucket_order)
    return model, state


def bucket_count(cfg: TrainConfig, model: nn.Module) -> int:
    """Buckets of the first step: ours reports its plan; torch's is the same rule
    (``torch_initial_plan``, which ours follows and is tested against torch's bucket sizes)."""
    if isinstance(model, DistributedDataParallel):
        return model.num_buckets
    if isinstance(model, TorchDDP):
        params = [p for p in model.module.parameters() if p.requires_grad]
        one = not model.find_unused_parameters  # torch's rule, as wrap() configured it
        return len(torch_initial_plan(params, torch_caps(cfg.bucket_cap_mb), one_bucket=one))
    return 0


def start_line(cfg: TrainConfig, world: int, model: nn.Module, hook_state: object | None) -> str:
    """The run's first log line: world, model, and how gradients are synchronised."""
    if cfg.sync != "allreduce":
        how = "dist.barrier() only" if cfg.sync == "barrier" else "nothing (local SGD)"
        return f"{world} ranks, model {cfg.model}, sync by {how}, no allreduce"
    if isinstance(model, DistributedDataParallel):
        wrapper = _buckets_text(model)
    else:
        wrapper = "torch's DistributedDataParallel"
    k = cfg.accumulate
    batch = f"global batch {cfg.batch_size}"
    if k > 1:
        batch = f"global batch {k * cfg.batch_size} ({k} micro-batches of {cfg.batch_size}, "
        batch += f"the first {k - 1} under no_sync)"
    hook = _hook_text(cfg.comm_hook, hook_state) + _optimizer_text(cfg, world)
    cap = (
        "auto: chosen at the rebuild" if cfg.bucket_cap_mb == "auto" else f"{cfg.bucket_cap_mb} MB"
    )
    return (
        f"{world} ranks, model {cfg.model}, {wrapper} (cap {cap}), "
        f"overlap {'on' if cfg.overlap else 'off'}, {batch}{hook}"
    )


def _buckets_text(ddp: DistributedDataParallel) -> str:
    n = ddp.num_buckets
    text = f"{n} bucket{'s' if n != 1 else ''}"
    if ddp.reducer.rebuild_pending:
        text += " for step 1, then rebuilt in gradient-ready order"
    return text


def _optimizer_text(cfg: TrainConfig, world: int) -> str:
    name = {"sgd": f"SGD (momentum {cfg.momentum:g})", "adam": "Adam"}[cfg.optimizer]
    if not cfg.shard_optimizer:
        return f", {name}"
    if cfg.wrapper == "torch":
        return f", {name} sharded over {world} ranks by torch's ZeroRedundancyOptimizer"
    return f", {name} sharded over {world} ranks (ZeRO-1: reduce-scatter, step, all-gather)"


def _hook_text(name: str, state: object | None) -> str:
    if name == "none":
        return ""
    if not name.startswith("hierarchical"):
        return f", comm hook {name}"
    if isinstance(state, HierarchicalState):
        return f", comm hook {name} ({state.topology.describe()}: within each node, then across)"
    # register_hierarchical registers nothing where two levels would only add steps
    return (
        f", comm hook {name}: all ranks on one node (or one per node), so it falls back to the "
        "flat allreduce (--nodes N declares local nodes)"
    )
