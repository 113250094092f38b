"""What the wrapper reads off the autograd graph: the parameters a forward's outputs reach, and
the ``torch.distributed.autograd`` context a backward will run in."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["dist_autograd_context", "reached_params", "unreached"]


def _tensors_in(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensors_in(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors_in(item)


def reached_params(outputs: Any) -> set[torch.Tensor]:
    """Parameters reachable from ``outputs`` through the autograd graph (leaves that would
    receive a gradient if backward ran from every output)."""
    reached: set[torch.Tensor] = set()
    stack = []
    for t in _tensors_in(outputs):
        if t.grad_fn is not None:
            stack.append(t.grad_fn)
        elif t.requires_grad:  # the output is a leaf parameter itself
            reached.add(t)
    seen = set()
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        var = getattr(fn, "variable", None)  # AccumulateGrad nodes hold their leaf
        if var is not None:
            reached.add(var)
        stack.extend(nxt for nxt, _ in fn.next_functions if nxt is not None)
    return reached


def unreached(outputs: Any, index: dict[torch.Tensor, int]) -> list[int]:
    """The indices (``index[param]``) of the parameters ``outputs`` do not reach: those that
    will get no gradient from this forward's backward."""
    reached = reached_params(outputs)
    return [i for p, i in index.items() if p not in reached]


def dist_autograd_context() -> int | None:
    """The id of the distributed-autograd context active on this thread, or None.

    Under ``torch.distributed.autograd`` gradients land in the context, not in ``.grad``, so
    the reducer must read and write them there. A context needs RPC, so the cheap RPC check
    runs first: a plain forward pays well under a microsecond for this.
    """
    if not torch.distributed.rpc.is_available():
        return None
    from torch.distributed.rpc import api

    if not api._is_current_rpc_agent_set():
        return None
    import torch.distributed.autograd as dist_autograd

    try:
        return dist_autograd._current_context()._context_id()
    except RuntimeError:  # RPC is up, but this forward runs outside any context
        return None
