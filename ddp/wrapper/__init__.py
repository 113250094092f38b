"""The library: ``DistributedDataParallel`` (:mod:`ddp.wrapper.distributed`) and its parts.

The module wraps a model; the reducer (``reducer*``) packs gradients into buckets
(``buckets``, ``bucket_buffers``, ``bucket_rebuild``) and allreduces each one as it fills,
through a communication hook (``grad_bucket``, ``comm_hooks``); ``join``, ``static_graph``,
``sparse`` and ``sink`` are the features torch's DDP has around that core. Import the class
as ``from ddp import DistributedDataParallel``; this package itself imports nothing, so its
torch-free module of hook names (``hook_names``) stays cheap to import.
"""
