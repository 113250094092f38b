"""The comm hook through which torchft's ``Manager`` drives our wrapper: each gradient bucket
is averaged by ``Manager.allreduce`` over the current quorum's group.

No ``from __future__ import annotations``: the wrapper, like torch's, compares the hook's
annotations with ``dist.GradBucket`` and ``Future[Tensor]`` objects.
"""

import time
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["manager_allreduce_hook"]


def manager_allreduce_hook(
    state: Any, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """``state`` is a ``ddp.recovery.tft.rank.Replica``. The manager averages over the replicas
    taking part (a replica healing this step contributes zeros) and never raises: a failed
    allreduce is reported to it (``errored()``) and the step will not commit. Its averaging
    callback runs only once the work is waited on, so the hook waits here (as torchft.ddp's
    does); the buckets are then reduced one after the other."""
    manager = state.manager
    buf = bucket.buffer()
    manager.allreduce(buf).wait()
    if manager.errored() is not None and state.noticed_t is None:
        state.noticed_t = time.time()
    done = torch.futures.Future()
    done.set_result(buf)
    return done
