"""Which of torch's distributed tests are DDP tests: in ``distributed_test.py``, those whose
name says so (``ddp``, ``DistributedDataParallel``) or whose body constructs or mentions DDP;
from ``ddp_under_dist_autograd_test.py``, every test of its two CPU classes. Found by reading
the shipped test classes, so a torch upgrade brings its new DDP tests along."""

from __future__ import annotations

import inspect
import os
import re

__all__ = ["ddp_tests"]

_NAME = re.compile(r"ddp|DistributedDataParallel", re.IGNORECASE)


def ddp_tests() -> list[str]:
    """Test ids: bare names for ``DistributedTest._DistTestBase``, ``Class.name`` for the
    dist-autograd classes (as ``_case.case_for`` takes them)."""
    os.environ.setdefault("BACKEND", "gloo")  # read by torch's module at import time
    os.environ.setdefault("WORLD_SIZE", "2")
    from torch.testing._internal.distributed.distributed_test import DistributedTest

    base = DistributedTest._DistTestBase
    out = []
    for name in sorted(n for n in dir(base) if n.startswith("test_")):
        try:
            src = inspect.getsource(inspect.unwrap(getattr(base, name)))
        except (OSError, TypeError):
            src = ""
        if _NAME.search(name) or _NAME.search(src):
            out.append(name)
    from torch.testing._internal.distributed import ddp_under_dist_autograd_test as rpc_ddp

    for cls in (rpc_ddp.DdpUnderDistAutogradTest, rpc_ddp.DdpComparisonTest):
        out += sorted(f"{cls.__name__}.{n}" for n in dir(cls) if n.startswith("test_"))
    return out
