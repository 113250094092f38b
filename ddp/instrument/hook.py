"""The comm hook every instrumented torch ``DistributedDataParallel`` gets at construction.

torch's reducer runs its built-in allreduce in C++, where Python cannot see it; a comm hook is
the one place where each bucket passes through Python. So the instrumentation registers
:class:`InstrumentHook` at construction. Its inner hook is the built-in's equivalent
(:func:`default_allreduce`) until the script registers its own, which then runs inside it:
wrapped, not replaced. Each call is started in the flight recorder (through the step tally),
and completed (or failed) by a callback on the future the inner hook returns, on gloo's thread
when the collective really finishes.

The default equals torch's built-in bitwise: the built-in multiplies each gradient by
``1 / world_size`` as it copies it into the bucket and then sums over ranks; the hook gets
the bucket unscaled (torch skips the division when a hook is registered), multiplies the
whole bucket by the same scalar, and sums.
"""

# No ``from __future__ import annotations``: torch's register_comm_hook compares the hook's
# annotations with dist.GradBucket, and strings would not match.
import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ddp.instrument.tally import StepTally

__all__ = ["InstrumentHook", "default_allreduce"]


def default_allreduce(process_group: Any, bucket: Any) -> torch.futures.Future:
    """The built-in's equivalent: the bucket times ``1 / world_size``, summed over the group."""
    group = process_group if process_group is not None else dist.group.WORLD
    tensor = bucket.buffer()
    tensor.mul_(1.0 / dist.get_world_size(group))
    return dist.all_reduce(tensor, group=group, async_op=True).get_future()


def _first(fut: torch.futures.Future) -> torch.Tensor:
    value = fut.value()
    return value[0] if isinstance(value, list) else value


class InstrumentHook:
    """``hook(state, bucket)`` as torch's reducer calls it: records the bucket's collective
    and runs the inner hook (the default, or the script's). ``step`` is the label the flight
    recorder gets; the instrumentation moves it on at every step."""

    def __init__(self, tally: StepTally, process_group: Any) -> None:
        self.tally = tally
        self.step = 0
        self.inner: Callable[..., torch.futures.Future] = default_allreduce
        self.inner_state: Any = process_group
        self.user_hook: Callable[..., Any] | None = None  # the script's, once it registers one
        self.__qualname__ = self.__name__ = "ddp_instrument_hook"  # torch logs the hook's name

    def use(self, state: Any, hook: Callable[..., Any]) -> None:
        """Run the script's ``hook(state, bucket)`` inside this one from now on."""
        self.inner, self.inner_state, self.user_hook = hook, state, hook

    def __call__(self, state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        tensor = bucket.buffer()
        op = "allreduce" if self.user_hook is None else "comm_hook"
        nbytes = tensor.numel() * tensor.element_size()
        seq = self.tally.start(op, step=self.step, bucket=bucket.index(), nbytes=nbytes)
        try:
            fut = self.inner(self.inner_state, bucket)
        except BaseException as e:
            self.tally.fail(seq, str(e) or type(e).__name__)
            raise
        return fut.then(functools.partial(self._done, seq))

    def _done(self, seq: int, fut: torch.futures.Future) -> torch.Tensor:
        try:
            value = _first(fut)
        except Exception as e:  # the error reaches the script through the reducer
            self.tally.fail(seq, str(e) or type(e).__name__)
            raise
        self.tally.complete(seq)
        return value
