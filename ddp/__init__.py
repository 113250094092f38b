"""A hand-built DistributedDataParallel on gloo allreduce: buckets, overlap, no_sync,
unused-parameter detection and buffer broadcast, checked against a single process and against
torch's own DDP."""

from ddp.distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
