"""The library: ``DistributedDataParallel`` (:mod:`ddp.wrapper.distributed`) and its parts.

Data parallelism in three moves: every replica starts from rank 0's weights (broadcast at
construction), every rank runs forward/backward on its own shard, and before the optimizer
steps every gradient is replaced by its mean over ranks (the reducer, during backward). Since
all ranks then apply the same update to the same weights, the replicas stay identical, and the
result equals one process training on the concatenated global batch.

``ddp/lesson.py`` shows those moves in one short file; the docstring of
:mod:`ddp.wrapper.distributed` goes on from there, file by file. Import the class as
``from ddp import DistributedDataParallel``; this package itself imports nothing, so its
torch-free module of hook names (``hook_names``) stays cheap to import.
"""
