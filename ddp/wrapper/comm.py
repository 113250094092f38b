"""Collective helpers the wrapper needs besides gradient allreduce: coalesced broadcast of
parameters and buffers, a cheap check that every rank built the same model, and the flight
recorder's record of each (when the wrapper has one; ``Recorder`` is what it must offer)."""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Sequence
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["Recorder", "broadcast_coalesced", "recorded", "sync_replicas", "verify_same_shapes"]

# Broadcasting a model tensor by tensor pays the collective latency floor once per tensor; one
# flat buffer per dtype pays it once. The chunk cap bounds the temporary memory.
_BROADCAST_CHUNK_BYTES = 250 * (1 << 20)


def _chunks(tensors: Sequence[torch.Tensor], cap_bytes: int) -> list[list[torch.Tensor]]:
    """Split tensors into same-dtype/device groups of at most ``cap_bytes`` (order kept)."""
    groups: dict[tuple[torch.dtype, torch.device], list[list[torch.Tensor]]] = {}
    sizes: dict[tuple[torch.dtype, torch.device], int] = {}
    for t in tensors:
        key = (t.dtype, t.device)
        nbytes = t.numel() * t.element_size()
        if key not in groups or sizes[key] + nbytes > cap_bytes:
            groups.setdefault(key, []).append([])
            sizes[key] = 0
        groups[key][-1].append(t)
        sizes[key] += nbytes
    return [chunk for chunk_list in groups.values() for chunk in chunk_list if chunk]


@torch.no_grad()
def broadcast_coalesced(
    tensors: Sequence[torch.Tensor],
    process_group: dist.ProcessGroup | None = None,
    cap_bytes: int = _BROADCAST_CHUNK_BYTES,
    src: int = 0,
) -> int:
    """Overwrite ``tensors`` on every rank with group rank ``src``'s values, one broadcast per
    dtype/device chunk. Returns the number of broadcasts issued (same on every rank)."""
    is_src = dist.get_rank(process_group) == src
    calls = 0
    for chunk in _chunks(tensors, cap_bytes):
        flat = torch.cat([t.detach().reshape(-1) for t in chunk])
        dist.broadcast(flat, group_src=src, group=process_group)
        calls += 1
        if not is_src:
            for t, piece in zip(chunk, flat.split([t.numel() for t in chunk]), strict=True):
                t.copy_(piece.view_as(t))
    return calls


def verify_same_shapes(
    named: Sequence[tuple[str, torch.Tensor]], process_group: dist.ProcessGroup | None = None
) -> None:
    """Raise on every rank if the ranks disagree on the parameter/buffer names, shapes or dtypes.

    A mismatch (a different model, a config typo on one node) would otherwise surface as a hang
    or as garbage gradients. One allreduce of [sig, -sig] with MAX yields max and min at once,
    so all ranks learn whether they agree and all of them raise together.
    """
    text = ";".join(f"{n}:{tuple(t.shape)}:{t.dtype}" for n, t in named)
    sig = zlib.crc32(text.encode()) + (len(named) << 32)
    both = torch.tensor([sig, -sig], dtype=torch.int64)
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=process_group)
    lo, hi = -int(both[1]), int(both[0])
    if lo != hi:
        raise RuntimeError(
            f"ranks built different models: rank {dist.get_rank(process_group)} has "
            f"{len(named)} parameters/buffers with signature {sig:#x}, but the group spans "
            f"[{lo:#x}, {hi:#x}]. Build the same module (same config and code) on every rank."
        )


class Recorder(Protocol):
    """What the wrapper needs of a flight recorder (``ddp.flight.recorder.FlightRecorder``): a
    record around a blocking collective, or a start and an end for an asynchronous one."""

    def record(
        self, op: str, *, step: int, bucket: int | None = None, nbytes: int = 0
    ) -> contextlib.AbstractContextManager[int]: ...

    def start(self, op: str, *, step: int, bucket: int | None = None, nbytes: int = 0) -> int: ...

    def complete(self, seq: int) -> None: ...

    def fail(self, seq: int, error: str) -> None: ...


def recorded(recorder: Recorder | None, op: str, step: int) -> contextlib.AbstractContextManager:
    """The flight recorder's record of one blocking collective, or nothing without a recorder."""
    if recorder is None:
        return contextlib.nullcontext()
    return recorder.record(op, step=step)


def sync_replicas(
    module: nn.Module,
    buffers: Sequence[torch.Tensor],
    process_group: dist.ProcessGroup | None,
    recorder: Recorder | None,
) -> None:
    """At construction: check that every rank built the same model, then make every replica
    start from rank 0's parameters (frozen ones included) and ``buffers``."""
    with recorded(recorder, "verify_shapes", step=-1):
        verify_same_shapes(
            list(module.named_parameters()) + list(module.named_buffers()), process_group
        )
    # Not on the hot path: one coalesced broadcast per dtype.
    with recorded(recorder, "broadcast", step=-1):
        broadcast_coalesced(list(module.parameters()) + list(buffers), process_group)
