"""The digest of a replica's parameters, for "did the replicas end identical"."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch

__all__ = ["params_sha256"]


@torch.no_grad()
def params_sha256(params: Iterable[torch.Tensor]) -> str:
    """sha256 over the raw bytes of ``params`` in order. For float32 parameters on the CPU it
    equals ``ddp.program.reference.params_sha256``; unlike that one it also takes parameters
    on an accelerator and dtypes numpy lacks (bfloat16), since a script may use either."""
    h = hashlib.sha256()
    for p in params:
        flat = p.detach().cpu().contiguous().reshape(-1)
        h.update(flat.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
