"""A hand-built DistributedDataParallel on gloo allreduce: buckets, overlap, no_sync,
unused-parameter detection and buffer broadcast, checked against a single process and against
torch's own DDP.

Start reading at :mod:`ddp.lesson`, the lesson's wrapper in one file; the package's rooms
(see README.md, "Architecture", and docs/layout.md):

* :mod:`ddp.wrapper`: the library, ``DistributedDataParallel`` and what it is built from;
* :mod:`ddp.program`: one rank's training run, ``python -m ddp`` (config, train loop, records);
* :mod:`ddp.flight`: the flight recorder and the diagnosis of a failed collective;
* :mod:`ddp.bench`: ``python -m ddp.bench``, ours against torch's DDP.

``import ddp`` stays torch-free, so the lab and the torch-free surface (:mod:`ddp.torchfree`)
load fast: ``ddp.DistributedDataParallel`` imports torch on first use. Static tools see it
through the ``TYPE_CHECKING`` import below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ddp.wrapper.distributed import DistributedDataParallel
    from ddp.wrapper.zero import ShardedOptimizer

__all__ = ["DistributedDataParallel", "ShardedOptimizer"]


def __getattr__(name: str) -> Any:
    if name == "DistributedDataParallel":
        from ddp.wrapper.distributed import DistributedDataParallel

        return DistributedDataParallel
    if name == "ShardedOptimizer":
        from ddp.wrapper.zero import ShardedOptimizer

        return ShardedOptimizer
    raise AttributeError(f"module 'ddp' has no attribute {name!r}")
