"""The parts of torch's DistributedDataParallel API beyond forward and ``no_sync``.

Communication hooks, uneven inputs (``join`` and the ``Joinable`` protocol), static graphs,
logging data, and pickling: a mixin of ``distributed.DistributedDataParallel``, kept apart
so the wrapper's file stays about forward. Names and error messages follow torch's, since
torch users and tools depend on them.
"""

from __future__ import annotations

import copy
import inspect
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join, JoinHook

from ddp.wrapper.autograd_graph import dist_autograd_context, reached_params
from ddp.wrapper.join import DDPJoinHook
from ddp.wrapper.logging_data import DDPLoggingData

__all__ = ["DDPApiMixin", "dist_autograd_context", "reached_params"]


class DDPApiMixin:
    """torch DDP's comm-hook, join, static-graph, logging and pickling API."""

    # ---- communication hooks -------------------------------------------------------------

    def register_comm_hook(self, state: object, hook: Callable) -> None:
        """Let ``hook(state, bucket)`` communicate each gradient bucket instead of the built-in
        averaging allreduce (torch's contract).

        ``bucket`` is a ``ddp.wrapper.grad_bucket.GradBucket`` whose ``buffer()`` holds this rank's
        *unaveraged* gradients: the hook divides (torch's ``allreduce_hook`` divides by the
        group size before allreducing). It returns a ``torch.futures.Future`` whose value is the
        bucket's new contents (one tensor shaped like the buffer). It may be registered once,
        before a forward whose backward is still to run. Why a hook: compression (fp16, bf16,
        PowerSGD) and other aggregation schemes, without touching the reducer.
        """
        if not callable(hook):
            raise TypeError("Communication hook must be callable.")
        _check_annotations(hook)
        self.reducer.register_comm_hook(state, hook)
        self._comm_hooks.append((hook, state))
        self._logging.data["comm_hook"] = getattr(hook, "__qualname__", repr(hook))

    # ---- uneven inputs -------------------------------------------------------------------

    def join(
        self,
        divide_by_initial_world_size: bool = True,
        enable: bool = True,
        throw_on_early_termination: bool = False,
    ) -> Join:
        """Context manager for ranks with different numbers of batches (see ``ddp.wrapper.join``):
        a rank that runs out shadows the others' collectives until all have joined, then all
        take the last joiner's model. ``divide_by_initial_world_size=False`` averages over the
        ranks still training; ``throw_on_early_termination`` raises on every rank instead."""
        return Join(
            [self],
            enable,
            throw_on_early_termination,
            divide_by_initial_world_size=divide_by_initial_world_size,
        )

    def join_hook(self, **kwargs: Any) -> JoinHook:
        """The ``Joinable`` protocol: the hook ``Join`` runs on this rank once it has joined."""
        return DDPJoinHook(self, kwargs.get("divide_by_initial_world_size", True))

    @property
    def join_device(self) -> torch.device:
        return self.device

    @property
    def join_process_group(self) -> Any:
        return self.process_group if self.process_group is not None else dist.group.WORLD

    # ---- static graph --------------------------------------------------------------------

    def _set_static_graph(self) -> None:
        """Declare the graph static (what ``static_graph=True`` does; see ``static_graph``).
        Only before training starts, as in torch."""
        if self.static_graph:
            warnings.warn(
                "You've set static_graph to be True, no need to set it again.", stacklevel=2
            )
            return
        if self._logging.iterations > 0 or self.reducer._expect_backward:
            raise self._logging.log_error(
                RuntimeError(
                    "set_static_graph() should be called before training loop starts and after "
                    "DistributedDataParallel is constructed."
                )
            )
        self.static_graph = True
        self.reducer.static.enable()
        self._logging.data["static_graph"] = 1
        if self.find_unused_parameters:
            warnings.warn(
                "You passed find_unused_parameters=true to DistributedDataParallel, "
                "`_set_static_graph` will detect unused parameters automatically, so you do not "
                "need to set find_unused_parameters=true, just be sure these unused parameters "
                "will not change during training loop while calling `_set_static_graph`.",
                stacklevel=2,
            )

    # ---- logging data --------------------------------------------------------------------

    def _rebuild_buckets(self) -> bool:
        """torch's ``reducer._rebuild_buckets()``: once, before a synchronised forward, the
        buckets are re-planned in the order gradients arrived (see ``bucket_rebuild``)."""
        if not self.reducer.rebuild_due():
            return False
        with self._recorded("rebuild_buckets", step=self.reducer.step):
            self.reducer.rebuild_buckets()
        self._logging.on_rebuild(self.reducer)
        return True

    @property
    def bucket_order(self) -> list[int] | None:
        """Not torch's API: the parameter order the buckets are (about to be) rebuilt in, for a
        checkpoint; give it to ``restore_bucket_order`` on resume (see
        ``ddp.wrapper.bucket_rebuild``)."""
        return self.reducer.bucket_order

    def restore_bucket_order(self, order: list[int]) -> None:
        """Not torch's API: rebuild the buckets in a checkpoint's ``bucket_order`` before the
        first forward of a resumed run, so every step has the buckets it had before. Every
        rank calls it (a broadcast; rank 0's order wins)."""
        with self._recorded("restore_bucket_order", step=self.reducer.step):
            self.reducer.restore_bucket_order(order)
        self._logging.on_rebuild(self.reducer)

    def _init_logging(
        self, params: Sequence[torch.Tensor], reduced: Sequence[torch.Tensor]
    ) -> None:
        """``params``: every parameter that requires grad (torch's indices in the logging
        data); ``reduced``: the reducer's (dense) ones, in its order."""
        settings = {
            "bucket_cap_bytes": int(self.bucket_cap_mb * (1 << 20)),
            "find_unused_parameters": int(self.find_unused_parameters),
            "gradient_as_bucket_view": int(self.gradient_as_bucket_view),
            "broadcast_buffers": int(self.forward_sync_buffers),
        }
        position = {id(p): k for k, p in enumerate(params)}
        self._logging = DDPLoggingData(
            self.module, params, self.reducer.bucket_sizes, self.process_group, settings
        )
        self._logging.param_index = [position[id(p)] for p in reduced]

    def _get_ddp_logging_data(self) -> dict[str, str | int]:
        """torch's logging data: settings, bucket sizes, hook, join and sampled timings (ns)."""
        return dict(self._logging.data)

    def _set_ddp_runtime_logging_sample_rate(self, sample_rate: int) -> None:
        """Record timings every ``sample_rate`` iterations after the first 10 (default 100)."""
        self._logging.set_sample_rate(sample_rate)

    # ---- pickling ------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        # The reducer's autograd hooks and the process group do not survive pickling; they are
        # rebuilt on load (torch does the same), so the loaded wrapper averages again.
        if self.process_group is not None and self.process_group != dist.group.WORLD:
            raise RuntimeError(
                "DDP Pickling/Unpickling are only supported when using DDP with the default "
                "process group. That is, when you have called init_process_group and have not "
                "passed process_group argument to DDP constructor"
            )
        state = copy.copy(self.__dict__)
        for key in ("reducer", "_logging", "flight_recorder"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # type: ignore[misc]
        self.process_group = None
        self.flight_recorder = None
        hooks, static = self._comm_hooks, self.static_graph
        self._comm_hooks, self.static_graph = [], False
        self._build_reducer()
        if static:
            self._set_static_graph()
        for hook, hook_state in hooks:
            self.register_comm_hook(hook_state, hook)


def _check_annotations(hook: Callable) -> None:
    """torch's checks of a hook's annotations (string annotations are compared by name)."""
    try:
        sig = inspect.signature(hook)
    except (TypeError, ValueError):  # builtins without a signature: nothing to check
        return
    bucket = sig.parameters.get("bucket")
    ann = bucket.annotation if bucket is not None else inspect.Parameter.empty
    if isinstance(ann, str):
        ok = ann.endswith("GradBucket")
    else:
        ok = (
            ann is inspect.Parameter.empty
            or ann is dist.GradBucket
            or (getattr(ann, "__name__", "") == "GradBucket")
        )
    if not ok:
        raise ValueError("Communication hook: bucket annotation should be dist.GradBucket.")
    ret = sig.return_annotation
    if isinstance(ret, str):
        ok = ret.replace(" ", "") in ("torch.futures.Future[torch.Tensor]", "Future[Tensor]")
    else:
        ok = ret is inspect.Signature.empty or ret == torch.futures.Future[torch.Tensor]
    if not ok:
        raise ValueError(
            "Communication hook: return annotation should be torch.futures.Future[torch.Tensor]."
        )
