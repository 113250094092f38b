"""Rebuilding the buckets once, in the order gradients really arrived (torch's "rebuilt buckets").

The construction-time plan (``buckets``) guesses backward's order from registration order.
A model whose layers are registered in another order than they run (an embedding registered
last but used first, a ``ModuleList`` applied in reverse) then fills its buckets out of plan
order; since buckets launch strictly in plan order, an early bucket waits for a gradient that
comes last, and nothing overlaps. torch's reducer corrects the guess once: it records the order
the gradients became ready in a synchronised backward, and before the next training forward
recomputes the buckets in that order with the same caps (``close_at_cap``, and the 1 MB first
bucket if the cap is the default).

Rules, torch's:

* every rank takes rank 0's order (one broadcast): the plan must be identical everywhere, and
  each rank's order may differ (gradients race on the autograd engine's threads);
* not with ``find_unused_parameters`` (unless ``static_graph``): the used set may change every
  iteration, so no recorded order describes the next one;
* with ``static_graph`` the first backward reduces everything at its end (nothing is recorded),
  so the order comes from the second one, and the rebuild happens before the third forward;
* once per wrapper. Parameters that got no gradient in the recorded backward go last, in the
  default order.

Joined ranks (``join()``) count the backwards they shadow and join the broadcast, so every rank
rebuilds in the same forward and keeps issuing the same collectives.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from ddp.wrapper.bucket_buffers import BucketBuffers
from ddp.wrapper.buckets import BucketSpec, plan_buckets

__all__ = ["BucketRebuild"]


class BucketRebuild:
    """Mixin of ``ddp.wrapper.reducer.Reducer``: records the ready order, rebuilds the plan once."""

    def _init_rebuild(self, caps: tuple[int, int]) -> None:
        self._caps = caps  # (first bucket's, the others'), as ddp.wrapper.buckets.torch_caps
        self.has_rebuilt_buckets = False
        self._order: list[int] = []  # the rebuilt plan's
        self._ready_order: list[int] = []  # the running backward's, from the hooks only
        self._ready_t: list[float] = []  # perf_counter() when each of _ready_order was ready
        self.last_ready_order: list[int] = []  # the last finished synchronised backward's
        self.last_ready_s: list[float] = []  # its gradients' ready times, s after backward began
        self._synced_backwards = 0  # finished or (joined) shadowed

    def _count_synced_backward(self, order: Sequence[int], stamps: Sequence[float] = ()) -> None:
        self.last_ready_order = list(order)
        self.last_ready_s = [t - self._backward_start_t for t in stamps]
        self._synced_backwards += 1

    def ready_profile(self) -> list[tuple[float, int]]:
        """(seconds after backward began, bytes) of each gradient of the last synchronised
        backward, in ready order: what ``bucket_cap_mb='auto'`` plans with."""
        params = [self._params[i] for i in self.last_ready_order]
        sizes = [p.numel() * p.element_size() for p in params]
        return list(zip(self.last_ready_s, sizes, strict=True))

    @property
    def rebuild_pending(self) -> bool:
        """Whether a rebuild is still to come (it never comes with find_unused_parameters)."""
        return not self.has_rebuilt_buckets and (self.static.enabled or not self._find_unused)

    def rebuild_due(self) -> bool:
        """Whether the next synchronised forward rebuilds (the same answer on every rank)."""
        return self.rebuild_pending and self._synced_backwards >= (2 if self.static.enabled else 1)

    def rebuild_buckets(self, caps: tuple[int, int] | None = None) -> bool:
        """Before a synchronised forward (or a joined rank's shadow of one): if due, replace
        the plan by one in rank 0's recorded ready order, with new ``caps`` if given (the auto
        cap's). True if it rebuilt. A collective: all ranks call it in the same iteration (they
        count the same synchronised backwards)."""
        if not self.rebuild_due():
            return False
        if caps is not None:
            self._caps = caps
        assert not self._expect_backward, "rebuilt between iterations only"
        self._rebuild_in(self._completed(self.last_ready_order))
        return True

    @property
    def bucket_order(self) -> list[int] | None:
        """The order the plan of the next iteration is built in: the rebuilt one, or the one
        the rebuild due before the next forward will take (None: the construction plan
        stays). What a checkpoint keeps, so a resumed run has an uninterrupted run's buckets
        at every step: with 3 or more ranks the layout decides gloo's summation order, so
        bitwise resumption needs the same buckets."""
        if self.has_rebuilt_buckets:
            return list(self._order)
        return self._completed(self.last_ready_order) if self.rebuild_due() else None

    def restore_bucket_order(self, order: Sequence[int]) -> None:
        """Rebuild in a checkpoint's ``bucket_order`` now (before the first forward), as the
        run that wrote it had. A collective, like the rebuild: rank 0's order wins."""
        assert not self._expect_backward, "rebuilt between iterations only"
        self._rebuild_in(order)

    def _completed(self, recorded: Sequence[int]) -> list[int]:
        seen = set(recorded)
        return list(recorded) + [i for i in reversed(range(len(self._params))) if i not in seen]

    def _rebuild_in(self, order: Sequence[int]) -> None:
        t = torch.tensor(order, dtype=torch.int64)
        if t.numel() != len(self._params):
            raise ValueError(f"bucket order of {t.numel()} parameters for {len(self._params)}")
        self.wait_work(dist.broadcast(t, group=self._pg, group_src=0, async_op=True))
        self._order = t.tolist()
        first, cap = self._caps
        plan = plan_buckets(self._params, cap, first, close_at_cap=True, order=self._order)
        self._adopt_plan(plan)
        self.has_rebuilt_buckets = True

    @torch.no_grad()
    def _adopt_plan(self, plan: Sequence[BucketSpec]) -> None:
        self._plan = list(plan)
        self._bucket_params = [[self._params[i] for i in spec.indices] for spec in self._plan]
        layout = BucketBuffers.build(self._params, self._plan, counts_in_tail=self._hook is None)
        self._set_buffers(layout)
        if self._as_view:  # torch too moves every .grad into the new buckets, keeping values
            layout.adopt_grads(self._params)
        self._launch_t = [0.0] * len(self._plan)
        self._done_t = [0.0] * len(self._plan)
        if self._sparse:
            self._sparse.first_index = len(self._plan)
        self._reset_iteration()
