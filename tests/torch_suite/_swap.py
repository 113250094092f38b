"""Putting our class where torch's DDP tests look for theirs.

The test modules bind ``DistributedDataParallel`` at import time (``from torch.nn.parallel import
DistributedDataParallel``), so patching ``torch.nn.parallel`` alone would miss them: every module
already imported that holds torch's class under any name gets ours instead. Called after the test
modules are imported, in every test process (fork and spawn alike).
"""

from __future__ import annotations

import sys

import torch.nn.parallel
import torch.nn.parallel.distributed

__all__ = ["TORCH_DDP", "install"]

# Kept before any swap, so the torch baseline and the refusal check can still name it.
TORCH_DDP = torch.nn.parallel.distributed.DistributedDataParallel


def install(replacement: type) -> list[str]:
    """Rebind every module-level name that refers to torch's DDP class to ``replacement``;
    returns the ``module.name`` bindings changed. Our own ``ddp`` package is left alone (the
    bench compares against torch's class on purpose)."""
    changed = []
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or mod_name == "ddp" or mod_name.startswith("ddp."):
            continue
        namespace = getattr(mod, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for attr, value in list(namespace.items()):
            if value is TORCH_DDP:
                setattr(mod, attr, replacement)
                changed.append(f"{mod_name}.{attr}")
    return sorted(changed)
