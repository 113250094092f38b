"""A pass-through autograd function on the wrapper's outputs whose backward runs first.

Backward reaches the outputs before any parameter, and always in the graph task that
``loss.backward()`` started, so this is where a callback for "backward is over" can be queued
safely even when parameters' gradients arrive inside nested (reentrant) backwards, as reentrant
activation checkpointing produces. The parameter hooks still queue it if the sink's backward
never runs (a backward that does not start from the outputs).

The price is one autograd function and one clone of the outputs per synchronised forward
(torch's DDP pays the same with find_unused_parameters or static_graph), against a backward
over all parameters: well below a percent of a step.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["through_sink"]


class _Sink(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, reducer: Any, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # Undefined gradients stay undefined instead of being materialised as zeros.
        ctx.set_materialize_grads(False)
        ctx.reducer = reducer
        # Clones, as torch's sink does by default: returning the inputs themselves would make
        # the outputs views that in-place operations in the loss could not modify.
        return tuple(t.clone() for t in inputs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[Any, ...]:
        ctx.reducer.queue_finalize()
        return (None, *grads)


def _map(obj: Any, fn: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj) if obj.grad_fn is not None else obj
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_map(x, fn) for x in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map(x, fn) for x in obj)
    if isinstance(obj, dict):
        return type(obj)((k, _map(v, fn)) for k, v in obj.items())
    return obj


def through_sink(reducer: Any, outputs: Any) -> Any:
    """``outputs`` with every tensor that has a grad_fn routed through the sink (tensors
    without one have no backward to run and are left alone, as torch does)."""
    found: list[torch.Tensor] = []
    _map(outputs, found.append)
    if not found:
        return outputs
    routed = iter(_Sink.apply(reducer, *found))
    return _map(outputs, lambda _t: next(routed))
