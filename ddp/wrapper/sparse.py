"""Sparse gradients: parameters whose gradient is a sparse COO tensor (``nn.Embedding`` or
``nn.EmbeddingBag`` with ``sparse=True``), reduced one sparse allreduce each.

Why not in the dense buckets: a flat dense bucket would turn an embedding's few touched rows
into the whole table on the wire, which is what ``sparse=True`` exists to avoid. torch's reducer
makes the same choice: such parameters get buckets of their own, and gloo allreduces a sparse
tensor by gathering every rank's indices and values (nnz may differ per rank) and summing them.
As in torch, each rank divides its gradient by the world size first (gloo has no AVG), and the
coalesced sum replaces ``.grad``.

Ordering: gloo pairs collectives by issue order, so these allreduces have a fixed place in the
iteration: after every dense bucket (and the hook layout's count allreduce) has completed, one
per sparse parameter, in parameter order, on every rank. A rank with no gradient for one (its
forward did not use it) still takes part with an empty sparse tensor of the right shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from ddp.wrapper.grad_bucket import GradBucket, hook_result

__all__ = ["SparseGrads", "split_sparse", "unexpected_grad_message"]


def split_sparse(
    module: nn.Module, named: Sequence[tuple[str, nn.Parameter]]
) -> tuple[list[tuple[str, nn.Parameter]], list[tuple[str, nn.Parameter]]]:
    """``named`` split into (dense, sparse), keeping order. A parameter is sparse when it is the
    weight of an ``nn.Embedding``/``nn.EmbeddingBag`` built with ``sparse=True``: torch decides
    the same way (``expect_sparse_gradient``), before any backward, so every rank agrees."""
    sparse_ids = {
        id(p)
        for m in module.modules()
        if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse
        for p in m.parameters(recurse=False)
    }
    dense = [(n, p) for n, p in named if id(p) not in sparse_ids]
    sparse = [(n, p) for n, p in named if id(p) in sparse_ids]
    return dense, sparse


class SparseGrads:
    """The sparse parameters of one DDP model and their per-iteration allreduces.
    ``first_index``: the bucket index the first of them has (the number of dense buckets).

    No autograd hooks: a sparse gradient is reduced only at the end of backward (after the dense
    buckets), so reading ``.grad`` then is enough, and it already holds what ``no_sync()``
    accumulated (autograd adds sparse gradients by concatenating their entries).
    """

    def __init__(
        self,
        params: Sequence[nn.Parameter],
        names: Sequence[str],
        process_group: dist.ProcessGroup | None,
        first_index: int,
    ) -> None:
        self._params = list(params)
        self._names = list(names)
        self._pg = process_group
        self._world = dist.get_world_size(process_group)
        self.first_index = first_index  # a bucket rebuild renumbers

    def __len__(self) -> int:
        return len(self._params)

    @torch.no_grad()
    def reduce(
        self,
        div: int,
        hook: Callable | None = None,
        state: object = None,
        dist_autograd_context: int | None = None,
    ) -> None:
        """Average every sparse gradient across ranks, in parameter order, and make the result
        ``.grad`` (under ``torch.distributed.autograd``: the context's gradient, in place, as
        for dense ones). With a communication hook each one goes through ``hook(state,
        bucket)`` as a bucket of its own whose ``buffer()`` is the sparse gradient, undivided,
        as torch's reducer hands it (``allreduce_hook`` works on it; hooks that need a dense
        buffer do not, on torch either). At world size 1 without a hook it already is the mean."""
        if not self._params or (self._world == 1 and hook is None):
            return
        context = None
        if dist_autograd_context is not None:
            import torch.distributed.autograd as dist_autograd

            context = dist_autograd.get_gradients(dist_autograd_context)
        # One at a time, each finished before the next starts: a hook may issue follow-up
        # collectives from its callbacks, which must not interleave differently across ranks.
        for k, p in enumerate(self._params):
            grad = p.grad if context is None else context.get(p)
            if grad is None:  # this rank's forward missed it: join with nothing to add
                grad = _empty_like_sparse(p)
            elif not grad.is_sparse:
                raise RuntimeError(unexpected_grad_message(self._names[k], grad, sparse=True))
            else:
                # Divide as it is, before gloo coalesces and sums: torch's order of rounding.
                grad = grad / div if hook is None else grad
            out = self._allreduce(k, grad, hook, state)
            if context is not None:
                if p in context:  # what DistributedOptimizer and get_gradients() read
                    context[p].copy_(out)
            elif p.grad is not None or out._nnz() > 0:  # no rank had any: .grad stays None
                p.grad = out

    @torch.no_grad()
    def shadow(self, hook: Callable | None = None, state: object = None) -> None:
        """A joined rank's part: an empty contribution to each sparse allreduce, in order."""
        for k, p in enumerate(self._params):
            self._allreduce(k, _empty_like_sparse(p), hook, state)

    def _allreduce(
        self, k: int, grad: torch.Tensor, hook: Callable | None, state: object
    ) -> torch.Tensor:
        if hook is None:
            dist.all_reduce(grad, group=self._pg)
            return grad
        # Numbered after the dense buckets, which keep is_last (hooks count iterations on it).
        bucket = GradBucket(self.first_index + k, grad, False, [self._params[k]])
        return hook_result(hook(state, bucket).wait(), bucket.index(), grad.numel())


def unexpected_grad_message(name: str, grad: torch.Tensor | None, *, sparse: bool = False) -> str:
    """Why a gradient cannot be reduced: none at all when its hook fired, or a layout other
    than the one decided at construction (sparse iff an ``Embedding(sparse=True)`` weight)."""
    if grad is None:
        return f"gradient hook fired for {name!r} without a gradient"
    if sparse:
        return (
            f"parameter {name!r} is the weight of a sparse=True embedding but got a dense "
            "gradient; this wrapper reduces it as a sparse tensor"
        )
    return (
        f"parameter {name!r} has a sparse gradient but is not the weight of an nn.Embedding or "
        "nn.EmbeddingBag with sparse=True, the only sparse gradients this wrapper reduces"
    )


def _empty_like_sparse(p: torch.Tensor) -> torch.Tensor:
    return torch.sparse_coo_tensor(
        torch.empty(1, 0, dtype=torch.long), torch.empty(0, *p.shape[1:], dtype=p.dtype), p.shape
    ).coalesce()
