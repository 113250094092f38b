"""What a rank holds in memory, as figures its step records carry: the optimizer state's bytes
and the process's peak resident set.

Why both: the optimizer state is what sharding divides (Adam keeps two tensors per parameter,
twice the model), counted exactly from the tensors; the peak RSS is what a container's memory
limit meets, and holds everything else too (torch itself, the model, the gradients, the
buckets, the temporaries of the optimizer's step). A sharded optimizer that keeps its local
shard's optimizer in ``.optim`` (torch's ``ZeroRedundancyOptimizer`` does) is followed there, so
its figure is this rank's shard only.
"""

from __future__ import annotations

import resource
import sys

import torch

__all__ = ["optimizer_state_bytes", "peak_rss_mib"]


def _tensors(value: object):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def optimizer_state_bytes(opt: object) -> int:
    """Bytes of every tensor in the optimizer's per-parameter state (``opt.state``'s values,
    e.g. Adam's ``exp_avg``, ``exp_avg_sq`` and ``step``), each storage counted once; through
    ``opt.optim`` when the optimizer wraps a local one. 0 before the first step (the state is
    made lazily) and for plain SGD without momentum."""
    while getattr(opt, "optim", None) is not None:
        opt = opt.optim  # type: ignore[attr-defined]
    state = getattr(opt, "state", None)
    if not state:
        return 0
    seen: set[int] = set()
    total = 0
    for tensor in _tensors(list(state.values())):
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key in seen and key != 0:
            continue
        seen.add(key)
        total += storage.nbytes()
    return total


def peak_rss_mib() -> float:
    """This process's peak resident set so far, in MiB (``ru_maxrss``: KiB on Linux, bytes on
    macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024
