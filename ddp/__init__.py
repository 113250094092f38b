"""A hand-built DistributedDataParallel on gloo allreduce: buckets, overlap, no_sync,
unused-parameter detection and buffer broadcast, checked against a single process and against
torch's own DDP.

``import ddp`` is torch-free: the wrapper is imported on first use, so the configuration
(:mod:`ddp.config`) and the log schema (:mod:`ddp.records`) stay cheap for the lab.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DistributedDataParallel"]


def __getattr__(name: str) -> Any:
    if name == "DistributedDataParallel":
        from ddp.distributed import DistributedDataParallel

        return DistributedDataParallel
    raise AttributeError(f"module 'ddp' has no attribute {name!r}")
