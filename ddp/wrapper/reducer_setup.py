"""The reducer of one wrapped module and the logging data that describes it, built together at
construction and again after unpickling (the reducer's autograd hooks do not survive pickling).

Which parameters the reducer averages: those that require grad, sparse-gradient ones apart
(``sparse``), in registration order, bucketed by torch's construction-time plan (``buckets``).
The logging data counts every parameter that requires grad, so it maps the reducer's indices to
those (torch's indices in ``rebuilt_per_bucket_param_indices`` and the ready order).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ddp.wrapper.buckets import torch_initial_plan
from ddp.wrapper.logging_data import DDPLoggingData
from ddp.wrapper.reducer import Reducer
from ddp.wrapper.reducer_support import Recorder
from ddp.wrapper.sparse import SparseGrads, split_sparse

__all__ = ["build_reducer", "picklable_state"]

# Rebuilt by ``build_reducer`` on load; the flight recorder (threads, files) stays behind.
_NOT_PICKLED = ("reducer", "_logging", "flight_recorder")


def build_reducer(
    module: nn.Module,
    process_group: dist.ProcessGroup | None,
    caps: tuple[int, int],
    *,
    one_bucket: bool,
    bucket_cap_mb: float,
    broadcast_buffers: bool,
    overlap: bool,
    gradient_as_bucket_view: bool,
    find_unused_parameters: bool,
    recorder: Recorder | None,
) -> tuple[Reducer, dict[torch.Tensor, int], DDPLoggingData]:
    """(the reducer with its hooks registered, each reduced parameter's index in it, the
    logging data with the construction settings). ``one_bucket``: see ``torch_initial_plan``."""
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    every = [p for _, p in named]
    named, sparse = split_sparse(module, named)
    params = [p for _, p in named]
    plan = torch_initial_plan(params, caps, one_bucket=one_bucket)
    param_index = {p: i for i, p in enumerate(params)}
    sparse_grads = SparseGrads(
        [p for _, p in sparse], [n for n, _ in sparse], process_group, len(plan)
    )
    reducer = Reducer(
        params,
        [n for n, _ in named],
        plan,
        process_group,
        caps=caps,
        overlap=overlap,
        gradient_as_bucket_view=gradient_as_bucket_view,
        find_unused_parameters=find_unused_parameters,
        recorder=recorder,
        sparse=sparse_grads,
    )
    settings = {
        "bucket_cap_bytes": int(bucket_cap_mb * (1 << 20)),
        "find_unused_parameters": int(find_unused_parameters),
        "gradient_as_bucket_view": int(gradient_as_bucket_view),
        "broadcast_buffers": int(broadcast_buffers),
    }
    position = {id(p): k for k, p in enumerate(every)}
    logging = DDPLoggingData(module, every, reducer.bucket_sizes, process_group, settings)
    logging.param_index = [position[id(p)] for p in params]
    return reducer, param_index, logging


def picklable_state(
    state: dict[str, Any], process_group: dist.ProcessGroup | None
) -> dict[str, Any]:
    """A wrapper's ``__dict__`` without what does not survive pickling (the reducer's autograd
    hooks, the logging data built with it, the flight recorder); torch's error for a wrapper
    of a non-default group, whose group cannot be pickled either."""
    if process_group is not None and process_group != dist.group.WORLD:
        raise RuntimeError(
            "DDP Pickling/Unpickling are only supported when using DDP with the default "
            "process group. That is, when you have called init_process_group and have not "
            "passed process_group argument to DDP constructor"
        )
    state = copy.copy(state)
    for key in _NOT_PICKLED:
        state.pop(key, None)
    return state
