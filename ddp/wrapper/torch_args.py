"""torch's DistributedDataParallel constructor arguments this wrapper does not act on.

A drop-in must accept what torch accepts, but silently ignoring an argument that changes what
torch's DDP computes would be worse than failing. So: the ones that mean nothing on CPU
(``device_ids``, ``output_device``, ``dim``, ``check_reduction``) are accepted (with torch's
own checks and warnings), and every other torch argument set to a non-default value is refused
with an error that names it.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["UNSUPPORTED_DEFAULTS", "buffer_sync", "check_arguments", "refuse_unsupported"]

# torch argument -> the default under which it does nothing (only those may be passed)
UNSUPPORTED_DEFAULTS: dict[str, Any] = {
    "delay_all_reduce_named_params": None,
    "param_to_hook_all_reduce": None,
    "mixed_precision": None,
    "device_mesh": None,
    "skip_all_reduce_unused_params": False,
    "bucket_cap_mb_list": None,
}


def refuse_unsupported(given: dict[str, Any]) -> None:
    """Raise for torch arguments with a non-default value, and for unknown ones."""
    for name, value in given.items():
        if name not in UNSUPPORTED_DEFAULTS:
            raise TypeError(
                f"DistributedDataParallel got an unknown argument {name}={value!r}: it is "
                "neither one of torch.nn.parallel.DistributedDataParallel's nor one of "
                "ddp's (overlap, flight_recorder); check the spelling"
            )
        if value is not UNSUPPORTED_DEFAULTS[name] and value != UNSUPPORTED_DEFAULTS[name]:
            raise NotImplementedError(
                f"DistributedDataParallel({name}={value!r}) is torch DDP's option, which this "
                f"wrapper does not implement; leave {name} at its default "
                f"({UNSUPPORTED_DEFAULTS[name]!r}) or use torch.nn.parallel.DistributedDataParallel"
            )


def check_arguments(
    module: nn.Module,
    bucket_cap_mb: float | None,
    torch_only: dict[str, Any],
    device_ids: Sequence[Any] | None,
    output_device: Any,
    check_reduction: bool,
    group_given: bool = False,
) -> None:
    """Every check ``DistributedDataParallel.__init__`` makes before it touches the group, in
    torch's order, so the same mistake raises the same error as with torch's DDP. A group
    passed in needs no default group (live recovery builds one per quorum)."""
    if not dist.is_available() or not (group_given or dist.is_initialized()):
        raise RuntimeError(
            "DistributedDataParallel needs an initialized process group: call "
            "torch.distributed.init_process_group('gloo', ...) first (or launch with "
            "python -m ddp / torchrun)."
        )
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
    if bucket_cap_mb is not None and not bucket_cap_mb >= 0:  # also rejects NaN
        raise ValueError(f"bucket_cap_mb must be >= 0, got {bucket_cap_mb}")
    refuse_unsupported(torch_only)
    if not any(p.requires_grad for p in module.parameters()):
        raise RuntimeError(
            "DistributedDataParallel is not needed when a module doesn't have any parameter "
            "that requires a gradient."
        )
    _check_cpu_args(list(module.parameters()), device_ids, output_device, check_reduction)


def buffer_sync(
    broadcast_buffers: bool | None, forward_sync_buffers: bool | None
) -> tuple[bool, bool]:
    """(sync buffers in training forwards, sync them at construction), by torch 2.13's rule:
    ``broadcast_buffers`` (default True) governs both; ``forward_sync_buffers``, when given,
    governs the forward, and construction always syncs."""
    broadcast = True if broadcast_buffers is None else broadcast_buffers
    if forward_sync_buffers is None:
        return broadcast, broadcast
    return forward_sync_buffers, True


def _check_cpu_args(
    params: Sequence[torch.Tensor],
    device_ids: Sequence[Any] | None,
    output_device: Any,
    check_reduction: bool,
) -> None:
    """torch's checks for the device arguments, which only place GPU replicas."""
    if device_ids is not None and len(device_ids) > 1:
        raise ValueError("device_ids can only be None or contain a single element.")
    types = {p.device.type for p in params}
    if len(types) > 1:
        raise ValueError(
            "DistributedDataParallel's input module must be on the same type of devices, but "
            f"input module parameters locate in {types}."
        )
    if device_ids or output_device is not None:
        raise ValueError(
            "DistributedDataParallel device_ids and output_device arguments only work with "
            "single-device/multiple-device GPU modules, and this wrapper runs CPU modules only; "
            f"got device_ids {device_ids}, output_device {output_device}, and module parameters "
            f"{ {p.device for p in params} }. Leave both at None."
        )
    if check_reduction:
        warnings.warn(
            "The `check_reduction` argument in `DistributedDataParallel` module is deprecated. "
            "Please avoid using it.",
            FutureWarning,
            stacklevel=4,
        )
