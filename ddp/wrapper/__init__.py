"""The library: ``DistributedDataParallel`` (:mod:`ddp.wrapper.distributed`) and its parts.

Data parallelism in three moves: every replica starts from rank 0's weights (broadcast at
construction), every rank runs forward/backward on its own shard, and before the optimizer
steps every gradient is replaced by its mean over ranks (the reducer, during backward). Since
all ranks then apply the same update to the same weights, the replicas stay identical, and the
result equals one process training on the concatenated global batch.

The module wraps a model; the reducer (``reducer*``) packs gradients into buckets
(``buckets``, ``bucket_buffers``, ``bucket_rebuild``) and allreduces each one as it fills,
through a communication hook (``grad_bucket``, ``comm_hooks``); ``join``, ``static_graph``,
``sparse`` and ``sink`` are the features torch's DDP has around that core. Import the class
as ``from ddp import DistributedDataParallel``; this package itself imports nothing, so its
torch-free module of hook names (``hook_names``) stays cheap to import.
"""
