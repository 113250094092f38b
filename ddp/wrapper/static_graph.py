"""``static_graph=True``: the reducer learns the graph in the first iteration and trusts it after.

torch's semantics: the set of parameters that get a gradient, and how many times each gradient
arrives, is the same every iteration. That buys two things:

* no graph walk per forward to find unused parameters (the first iteration found them);
* a parameter whose gradient arrives more than once per backward is fine. Reentrant activation
  checkpointing does that: each checkpointed segment re-runs its forward and its own inner
  backward, and a parameter used in two segments is accumulated once per segment. Counting the
  arrivals in the first iteration tells later iterations when a gradient is complete.

The first iteration therefore reduces nothing during backward: it only counts, and every bucket
is reduced at the end (torch calls this "delay all-reduce"). The end-of-backward callback is
queued from the outputs' gradient hook (``reducer``), i.e. on the outermost graph task; a hook
inside a checkpoint's inner backward would queue it on an inner task that ends too early.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

__all__ = ["StaticGraph", "may_set_static_graph", "warn_find_unused_with_static_graph"]


def may_set_static_graph(
    already: bool, started: bool, log_error: Callable[[Exception], Exception]
) -> bool:
    """torch's rules for ``_set_static_graph()``, with torch's messages: once (a second call
    warns and does nothing), and only before training starts (``started`` raises, the error
    kept by ``log_error`` in the logging data)."""
    if already:
        warnings.warn("You've set static_graph to be True, no need to set it again.", stacklevel=3)
        return False
    if started:
        raise log_error(
            RuntimeError(
                "set_static_graph() should be called before training loop starts and after "
                "DistributedDataParallel is constructed."
            )
        )
    return True


def warn_find_unused_with_static_graph() -> None:
    """torch's warning: a static graph finds the unused parameters by itself."""
    warnings.warn(
        "You passed find_unused_parameters=true to DistributedDataParallel, "
        "`_set_static_graph` will detect unused parameters automatically, so you do not "
        "need to set find_unused_parameters=true, just be sure these unused parameters "
        "will not change during training loop while calling `_set_static_graph`.",
        stacklevel=3,
    )


class StaticGraph:
    """Per-parameter gradient-arrival counts, and what the first iteration fixed."""

    def __init__(self, num_params: int) -> None:
        self.enabled = False
        self.first_iteration = False
        self._n = num_params
        self._fires = [0] * num_params
        self._expected: list[int] = []
        self.unused: list[int] = []  # parameters this rank's first iteration gave no gradient
        self._skip: set[int] = set()  # ... and those no rank gave one (their .grad stays)

    def enable(self) -> None:
        self.enabled = True
        self.first_iteration = True

    def reset_iteration(self) -> None:
        if self.enabled:
            self._fires = [0] * self._n

    def fired(self, i: int) -> bool:
        return self._fires[i] > 0

    def arrived(self, i: int, name: str) -> bool:
        """Count one arrival of parameter i's gradient; True when it is complete (never in the
        first iteration, which reduces everything at the end)."""
        self._fires[i] += 1
        if self.first_iteration:
            return False
        expected = self._expected[i]
        if self._fires[i] > expected:
            raise RuntimeError(
                f"static_graph=True, but parameter {name!r} received gradient number "
                f"{self._fires[i]} in this backward, while the first iteration gave it "
                f"{expected}: the graph changed (a parameter used now that was unused then, or "
                "used more often). Construct without static_graph (with "
                "find_unused_parameters=True if parameters are unused in some iterations)."
            )
        return self._fires[i] == expected

    def end_iteration(self, skip: set[int]) -> set[int]:
        """Record what the first iteration learned; the parameters whose .grad to leave alone."""
        if self.first_iteration:
            self._expected = list(self._fires)
            self.unused = [i for i, f in enumerate(self._fires) if f == 0]
            self._skip = set(skip)
            self.first_iteration = False
            return skip
        return self._skip
