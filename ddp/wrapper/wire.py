"""What ranks send each other besides gradients: JSON and raw tensors, never pickle.

torch's object collectives (``broadcast_object_list``, ``all_gather_object``, ...) pickle on
the sender and unpickle on every receiver, so whoever can write to the group's transport runs
code in every rank, and a checkpoint its owner loaded with ``weights_only=True`` loses that
protection on its way to the others. Here a message is UTF-8 JSON in a uint8 tensor whose
length goes first, and a state (a ``state_dict``, an optimizer's, RNG states) is a JSON
skeleton that names each tensor's dtype and shape, followed by one uint8 tensor holding all the
tensors' bytes; the receiver rebuilds the state from the two. Python floats survive JSON
exactly (``repr`` round-trips), tensors bit for bit.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["all_gather_json", "broadcast_json", "broadcast_state", "decode_state", "encode_state"]


def _to_bytes(obj: Any) -> torch.Tensor:
    # Python's json writes and reads NaN and Infinity (not standard JSON, but both ends are this
    # module), so a float's every value round-trips
    data = json.dumps(obj, separators=(",", ":")).encode()
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _from_bytes(t: torch.Tensor) -> Any:
    return json.loads(bytes(t.numpy().tobytes()).decode())


def broadcast_json(obj: Any, src: int, group: dist.ProcessGroup | None = None) -> Any:
    """``obj`` (JSON-serialisable, read on ``src`` only) as every rank of ``group`` decodes it,
    ``src`` included, so all ranks hold the same value. ``src`` is a global rank, as in
    ``dist.broadcast``; a collective."""
    mine = dist.get_rank() == src
    payload = _to_bytes(obj) if mine else None
    length = torch.tensor([payload.numel() if payload is not None else 0], dtype=torch.int64)
    dist.broadcast(length, src=src, group=group)
    n = int(length.item())
    if payload is None:
        payload = torch.empty(n, dtype=torch.uint8)
    if n:
        dist.broadcast(payload, src=src, group=group)
    return _from_bytes(payload)


def all_gather_json(obj: Any, group: dist.ProcessGroup | None = None) -> list[Any]:
    """Every rank's ``obj`` (JSON-serialisable), in group rank order; a collective."""
    world = dist.get_world_size(group)
    mine = _to_bytes(obj)
    lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(lengths, torch.tensor([mine.numel()], dtype=torch.int64), group=group)
    sizes = [int(t.item()) for t in lengths]
    # all_gather wants equal sizes: every message padded to the longest, cut back on decoding
    padded = torch.zeros(max(sizes), dtype=torch.uint8)
    padded[: mine.numel()] = mine
    gathered = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded, group=group)
    return [_from_bytes(t[:n]) for t, n in zip(gathered, sizes, strict=True)]


def encode_state(state: Any) -> tuple[Any, torch.Tensor]:
    """(JSON skeleton, the bytes of every tensor in it, in order) of a nest of dicts, lists,
    tuples, tensors and JSON scalars. Raises ``TypeError`` on anything else."""
    chunks: list[torch.Tensor] = []

    def enc(x: Any) -> Any:
        if x is None or isinstance(x, bool | int | float | str):
            return x
        if isinstance(x, torch.Tensor):
            if x.layout != torch.strided or x.is_quantized:
                raise TypeError(f"only dense tensors cross the wire, got {x.layout} {x.dtype}")
            flat = x.detach().cpu().contiguous().reshape(-1)
            chunks.append(flat.view(torch.uint8))
            return {
                "tensor": len(chunks) - 1,
                "dtype": str(x.dtype).removeprefix("torch."),
                "shape": list(x.shape),
                "nbytes": flat.numel() * flat.element_size(),
            }
        if isinstance(x, tuple):
            return {"tuple": [enc(v) for v in x]}
        if isinstance(x, list):
            return {"list": [enc(v) for v in x]}
        if isinstance(x, dict):
            # Keys stay typed (an optimizer's state is keyed by int) and in order.
            out: dict[str, Any] = {"dict": [[enc(k), enc(v)] for k, v in x.items()]}
            if isinstance(x, OrderedDict):
                out["ordered"] = True
                # a module's state_dict carries per-module versions that load_state_dict reads
                if hasattr(x, "_metadata"):
                    out["metadata"] = enc(x._metadata)
            return out
        raise TypeError(f"{type(x).__name__} cannot cross the wire: tensors and JSON only")

    skeleton = enc(state)
    return skeleton, torch.cat(chunks) if chunks else torch.empty(0, dtype=torch.uint8)


def _dtype(name: Any) -> torch.dtype:
    found = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(found, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return found


def decode_state(skeleton: Any, blob: torch.Tensor) -> Any:
    """Inverse of ``encode_state``: the state, with fresh tensors cut from ``blob``. Raises
    ``ValueError`` on a skeleton that does not describe ``blob`` or holds anything else."""
    offset = 0

    def dec(x: Any) -> Any:
        nonlocal offset
        if x is None or isinstance(x, bool | int | float | str):
            return x
        if not isinstance(x, dict):
            raise ValueError(f"unexpected {type(x).__name__} in a state skeleton")
        if "tensor" in x:
            dtype, shape, n = _dtype(x["dtype"]), [int(s) for s in x["shape"]], int(x["nbytes"])
            if n < 0 or offset + n > blob.numel():
                raise ValueError("a state skeleton names more tensor bytes than were sent")
            # clone: a dtype view needs storage aligned for its element size
            raw = blob[offset : offset + n].clone()
            offset += n
            return raw.view(dtype).reshape(shape)
        if "tuple" in x:
            return tuple(dec(v) for v in x["tuple"])
        if "list" in x:
            return [dec(v) for v in x["list"]]
        if "dict" in x:
            pairs = [(dec(k), dec(v)) for k, v in x["dict"]]
            if not x.get("ordered"):
                return dict(pairs)
            out: OrderedDict = OrderedDict(pairs)
            if "metadata" in x:
                out._metadata = dec(x["metadata"])  # type: ignore[attr-defined]
            return out
        raise ValueError(f"unexpected keys {sorted(x)} in a state skeleton")

    state = dec(skeleton)
    if offset != blob.numel():
        raise ValueError(f"{blob.numel() - offset} tensor bytes sent that no skeleton names")
    return state


def broadcast_state(state: Any, src: int, group: dist.ProcessGroup | None = None) -> Any:
    """``state`` (read on ``src`` only: tensors, dicts, lists, tuples, JSON scalars) rebuilt on
    every rank of ``group``: its skeleton as JSON, then its tensors' bytes in one uint8 tensor
    whose size the skeleton gives. ``src`` gets its own state back; a collective."""
    mine = dist.get_rank() == src
    skeleton, blob = encode_state(state) if mine else (None, None)
    header = broadcast_json(
        {"skeleton": skeleton, "nbytes": int(blob.numel())} if blob is not None else None,
        src,
        group,
    )
    if blob is None:
        blob = torch.empty(int(header["nbytes"]), dtype=torch.uint8)
    if blob.numel():
        dist.broadcast(blob, src=src, group=group)
    return state if mine else decode_state(header["skeleton"], blob)
