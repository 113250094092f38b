"""The test-case classes that run torch's shipped DDP tests, with torch's class or ours.

Our own small equivalent of torch's ``test/distributed/test_distributed_spawn.py`` and
``rpc/test_tensorpipe_agent.py`` (not shipped in the wheel): torch's test mixins combined with a
base that starts the ranks per test. Importing this module is what swaps the class
(``TORCH_SUITE_IMPL=ours``), so it happens in the test processes whether they are forked from
the worker or spawned (a spawned rank re-imports this module to find ``_run``). The worker sets
``BACKEND``/``WORLD_SIZE`` before importing it: ``distributed_test`` reads them at import time.

Each rank that raises records its classified outcome (``_classify``) in a directory made per
test, which the parent collects in ``tearDown``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import unittest
from pathlib import Path

import torch.multiprocessing
from torch.testing._internal.common_distributed import MultiProcessTestCase
from torch.testing._internal.distributed.ddp_under_dist_autograd_test import (
    DdpComparisonTest,
    DdpUnderDistAutogradTest,
)
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend
from torch.testing._internal.distributed.rpc.tensorpipe_rpc_agent_test_fixture import (
    TensorPipeRpcAgentTestFixture,
)

from tests.torch_suite import _swap
from tests.torch_suite._classify import Outcome, classify

__all__ = ["CASES", "IMPL", "SWAPPED", "case_for"]

IMPL = os.environ.get("TORCH_SUITE_IMPL", "torch")
SWAPPED: list[str] = []
if IMPL == "ours":  # after the imports above: their import-time bindings are swapped too
    import ddp

    SWAPPED = _swap.install(ddp.DistributedDataParallel)


def _outcome_path(rank: int) -> Path:
    return Path(os.environ["TORCH_SUITE_OUTCOMES"]) / f"rank{rank}.json"


class _Recorded:
    """Mixin (first in the MRO): start ranks by fork or spawn, record what each rank raised."""

    outcomes: list[Outcome]

    def setUp(self) -> None:
        self._outcome_dir = tempfile.mkdtemp(prefix="torch-suite-outcomes-")
        os.environ["TORCH_SUITE_OUTCOMES"] = self._outcome_dir  # inherited by the ranks
        self.outcomes = []
        super().setUp()

    def tearDown(self) -> None:
        for path in sorted(Path(self._outcome_dir).glob("rank*.json")):
            self.outcomes.append(json.loads(path.read_text()))
        shutil.rmtree(self._outcome_dir, ignore_errors=True)
        super().tearDown()

    def _spawn_processes(self) -> None:
        # fork: the ranks inherit the imported modules (torch's test modules take ~5 s to
        # import, per rank and test under spawn). spawn: torch's own way, for cross-checking.
        method = os.environ.get("TORCH_SUITE_START", "fork")
        self._start_processes(torch.multiprocessing.get_context(method).Process)

    def run_test(self, test_name: str, parent_pipe: object) -> None:
        """Rank side: run the test as torch does, recording a failure before it is re-raised."""
        test = getattr(self, test_name)

        def recorded() -> None:
            try:
                test()
            except unittest.SkipTest:
                raise
            except Exception as e:
                out = classify(e, check_refusal=IMPL == "ours")
                out.update(rank=self.rank, time=time.time())
                _outcome_path(self.rank).write_text(json.dumps(out))
                raise

        setattr(self, test_name, recorded)
        super().run_test(test_name, parent_pipe)


class _Started:
    """What torch's spawn helpers add: start the ranks once the fixture is set up."""

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()


class DistTestCase(_Recorded, _Started, TestDistBackend, DistributedTest._DistTestBase):
    """``distributed_test.py``'s tests, as ``test_distributed_spawn.py`` runs them."""


class DdpUnderDistAutogradCase(
    _Recorded,
    _Started,
    DdpUnderDistAutogradTest,
    TensorPipeRpcAgentTestFixture,
    MultiProcessTestCase,
):
    """``ddp_under_dist_autograd_test.py``: DDP inside a dist-autograd (RPC) training loop."""


class DdpComparisonCase(
    _Recorded, _Started, DdpComparisonTest, TensorPipeRpcAgentTestFixture, MultiProcessTestCase
):
    """``ddp_under_dist_autograd_test.py``: DDP vs dist autograd, same gradients."""


# Test-id prefix -> class; distributed_test's tests go by their bare names, as in torch's logs.
CASES: dict[str, type[unittest.TestCase]] = {
    "": DistTestCase,
    "DdpUnderDistAutogradTest.": DdpUnderDistAutogradCase,
    "DdpComparisonTest.": DdpComparisonCase,
}


def case_for(test_id: str) -> unittest.TestCase:
    """The test case instance for ``test_id`` (``test_x`` or ``DdpComparisonTest.test_x``)."""
    prefix, _, name = test_id.rpartition(".")
    return CASES[f"{prefix}." if prefix else ""](name)
