"""The refusal contract (``_classify``) and the swap, without running torch's suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from torch import nn

import ddp
from tests.torch_suite._classify import classify
from tests.torch_suite._driver import ROOT


def _raised(code: str, filename: str) -> BaseException:
    try:
        exec(compile(code, filename, "exec"), {})
    except BaseException as e:
        return e
    raise AssertionError("did not raise")


def test_not_implemented_from_ddp_is_a_refusal() -> None:
    inside = str(Path(ddp.__file__).with_name("distributed.py"))
    e = _raised("raise NotImplementedError('register_comm_hook is not supported by ddp')", inside)
    out = classify(e, check_refusal=True)
    assert out["status"] == "refused"
    assert out["reason"] == "needs API: register_comm_hook is not supported by ddp"


def test_not_implemented_elsewhere_is_a_failure() -> None:
    e = _raised("raise NotImplementedError('torch internals')", "/elsewhere/module.py")
    assert classify(e, check_refusal=True)["status"] == "fail"


def test_unexpected_constructor_keyword_names_the_argument(tmp_path) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/r", rank=0, world_size=1)
    try:
        with pytest.raises(TypeError) as info:
            ddp.DistributedDataParallel(nn.Linear(2, 2), bogus_option=1)
    finally:
        dist.destroy_process_group()
    assert classify(info.value, check_refusal=True)["reason"] == "needs API: bogus_option="


def test_missing_method_on_our_class_and_over_rpc() -> None:
    e = AttributeError("'DistributedDataParallel' object has no attribute 'join'")
    assert classify(e, check_refusal=True)["reason"] == "needs API: DistributedDataParallel.join"
    remote = TypeError(
        'On WorkerInfo(id=0, name=worker0):\nTypeError("DistributedDataParallel.__init__() got '
        "an unexpected keyword argument 'check_reduction'\")\nTraceback (most recent call last):"
    )
    assert classify(remote, check_refusal=True)["reason"] == "needs API: check_reduction="


def test_anything_else_fails_with_its_first_line() -> None:
    e = RuntimeError("Tensor-likes are not close!\n\nMismatched elements: 5 / 5")
    out = classify(e, check_refusal=True)
    assert (out["status"], out["reason"]) == ("fail", "RuntimeError: Tensor-likes are not close!")
    foreign = AttributeError("'Linear' object has no attribute 'join'")
    assert classify(foreign, check_refusal=True)["status"] == "fail"
    assert classify(TypeError("got an unexpected keyword"), check_refusal=False)["status"] == "fail"


def test_swap_reaches_every_import_time_alias() -> None:
    """In a test process, every name torch's test modules bound to torch's class is ours."""
    code = (
        "import os; os.environ.update(BACKEND='gloo', WORLD_SIZE='2', TORCH_SUITE_IMPL='ours')\n"
        "from tests.torch_suite import _case\n"
        "import torch.nn.parallel, ddp\n"
        "assert torch.nn.parallel.DistributedDataParallel is ddp.DistributedDataParallel\n"
        "print('\\n'.join(_case.SWAPPED))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    swapped = set(out.stdout.split())
    prefix = "torch.testing._internal.distributed."
    assert {
        "torch.nn.parallel.DistributedDataParallel",
        "torch.nn.parallel.distributed.DistributedDataParallel",
        f"{prefix}distributed_test.DistributedDataParallel",
        f"{prefix}ddp_under_dist_autograd_test.DistributedDataParallel",
    } <= swapped


def test_a_failure_counts_only_if_it_fails_twice(monkeypatch) -> None:
    from tests.torch_suite import _suite

    calls: list[list[str]] = []

    def fake_run(tests, which, **kw):  # the second run: the race is gone, the bug is not
        calls.append(list(tests))
        return {"flaky": {"status": "pass", "reason": ""}, "broken": {"status": "fail"}}

    monkeypatch.setattr(_suite, "run_tests", fake_run)
    rows = {"flaky": {"status": "fail", "reason": "race"}, "broken": {"status": "fail"}}
    again = _suite._retried(rows, {})
    assert calls == [["flaky", "broken"]]
    assert again == {
        "flaky": {"status": "pass", "reason": "passed on a second run; the first failed: race"}
    }
