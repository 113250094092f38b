"""ddp.instrument on real gloo ranks: every DistributedDataParallel (torch's and ours) reports
its steps and a digest, a script's own comm hook still runs (wrapped) with the right result,
the numerics of torch's DDP are unchanged, and the flight recorder dumps on demand while its
rank is blocked inside a collective. Spawned ranks do not run atexit handlers, so they call
the session's exit work themselves; tests/ddp/test_examples.py covers the real exit."""

# No ``from __future__ import annotations``: torch checks a comm hook's annotations against
# dist.GradBucket, and strings would not match.
import copy
import os
import signal
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

from ddp.flight.diagnosis import diagnose
from ddp.flight.dumps import dump_path, load_dumps, request_dumps
from ddp.instrument.env import ENV_INSTRUMENT, ENV_LOG_DIR
from ddp.instrument.records import ScriptDDPRecord, ScriptEndRecord, ScriptHookRecord
from ddp.program.records import load_run, read_rank_log
from tests.helpers import run_ranks

STEPS = 3
HOOK_CALLS: list[int] = []


def summing_hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A script's own hook: the sum over ranks, not the mean, so its effect is visible."""
    HOOK_CALLS.append(bucket.index())
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(4, 8, generator=g), torch.randn(4, 2, generator=g)


def _train(model: nn.Module, rank: int, steps: int) -> list[torch.Tensor]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        x, y = _batch(rank, step)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _summed_grads(net: nn.Module, rank: int) -> list[torch.Tensor]:
    """What the summing hook must leave in .grad: every rank's local gradient, summed."""
    local = copy.deepcopy(net)
    x, y = _batch(rank, 0)
    F.mse_loss(local(x), y).backward()
    grads = [p.grad.clone() for p in local.parameters()]
    for g in grads:
        dist.all_reduce(g)
    return grads


def _with_own_hook(model: nn.Module, net: nn.Module, rank: int) -> tuple[int, str]:
    """One step with the summing hook: the .grad it leaves, and a second registration's error."""
    HOOK_CALLS.clear()
    model.register_comm_hook(None, summing_hook)
    x, y = _batch(rank, 0)
    F.mse_loss(model(x), y).backward()
    for p, want in zip(net.parameters(), _summed_grads(_net(), rank), strict=True):
        assert_close(p.grad, want)
    try:
        model.register_comm_hook(None, summing_hook)
        second = "accepted"
    except RuntimeError as e:
        second = str(e)
    return len(HOOK_CALLS), second


def _train_ranks(rdzv, log_dir: str) -> dict:
    from ddp import DistributedDataParallel as Ours
    from ddp.instrument.activate import install
    from ddp.instrument.session import session

    os.environ[ENV_INSTRUMENT], os.environ[ENV_LOG_DIR] = "1", log_dir
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=rdzv.init_method, rank=rdzv.rank, world_size=rdzv.world_size
    )
    rank = rdzv.rank
    try:
        plain = _train(nn.parallel.DistributedDataParallel(_net()), rank, STEPS)  # not patched yet
        install()
        seen = _train(nn.parallel.DistributedDataParallel(_net()), rank, STEPS)
        for a, b in zip(plain, seen, strict=True):
            assert torch.equal(a, b), "instrumented torch DDP must train bitwise the same"
        out = {}
        net = _net()
        out["torch"] = _with_own_hook(nn.parallel.DistributedDataParallel(net), net, rank)
        net = _net()
        out["ours"] = _with_own_hook(Ours(net), net, rank)
        session().finish()
        return out
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[dict, Path]:
    log_dir = tmp_path_factory.mktemp("logs")
    rdzv = tmp_path_factory.mktemp("rdzv")
    return run_ranks(_train_ranks, 2, rdzv, str(log_dir), timeout_s=240), log_dir


@pytest.mark.timeout(300)
def test_own_comm_hook_runs_wrapped_with_its_result(trained) -> None:
    results, _ = trained
    for rank in (0, 1):
        for wrapper in ("torch", "ours"):
            calls, second = results[rank][wrapper]
            assert calls == 1, f"rank {rank}, {wrapper}: the script's hook ran {calls} times"
            assert "only be called once" in second, second


@pytest.mark.timeout(300)
def test_every_module_reports_its_steps(trained) -> None:
    _, log_dir = trained
    logs = load_run(log_dir)
    assert sorted(logs) == [0, 1]
    for log in logs.values():
        built = [r for r in log.records if isinstance(r, ScriptDDPRecord)]
        assert [b.wrapper for b in built] == ["torch", "torch", "ddp"]
        assert all(b.world_size == 2 and b.pid > 0 for b in built)
        steps = {m: [s for s in log.script_steps if s.module == m] for m in range(3)}
        assert [s.step for s in steps[0]] == list(range(1, STEPS + 1))
        assert len(steps[1]) == len(steps[2]) == 1
        for m in range(3):
            for s in steps[m]:
                assert s.allreduces == 1 and s.bytes == built[m].param_bytes
                assert s.bucket_bytes == [s.bytes] and len(s.buckets_ms) == 1
                launch, done = s.buckets_ms[0]
                assert 0 <= launch <= done <= s.step_ms
                assert s.t0 <= s.t1
        hooks = [r for r in log.records if isinstance(r, ScriptHookRecord)]
        assert [(h.module, h.hook) for h in hooks] == [(1, "summing_hook"), (2, "summing_hook")]


@pytest.mark.timeout(300)
def test_digests_say_the_replicas_agree(trained) -> None:
    _, log_dir = trained
    ends = {
        rank: {r.module: r for r in log.records if isinstance(r, ScriptEndRecord)}
        for rank, log in load_run(log_dir).items()
    }
    assert sorted(ends[0]) == [0, 1, 2]
    assert [ends[0][m].steps for m in range(3)] == [STEPS, 1, 1]
    for m in range(3):
        assert ends[0][m].params_sha256 == ends[1][m].params_sha256
    # module 0 trained, the hook modules did not step: their digests differ from it
    assert ends[0][0].params_sha256 != ends[0][1].params_sha256


def _wait(predicate, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout_s:.0f} s")
        time.sleep(0.05)


def _stuck_dump(path: Path) -> bool:
    dumps = load_dumps(path.parent)
    return 0 in dumps and any(r["state"] == "started" for r in dumps[0]["records"])


def _hang_ranks(rdzv, log_dir: str) -> dict:
    """Rank 0 enters step 3's allreduce; rank 1 stays away and asks rank 0 for its flight
    recorder (SIGUSR2, then the request file), then joins step 3 and both finish."""
    from ddp.instrument.activate import install
    from ddp.instrument.session import session

    os.environ[ENV_INSTRUMENT], os.environ[ENV_LOG_DIR] = "1", log_dir
    torch.set_num_threads(1)
    install()
    dist.init_process_group(
        "gloo", init_method=rdzv.init_method, rank=rdzv.rank, world_size=rdzv.world_size
    )
    rank, out = rdzv.rank, {}
    try:
        model = nn.parallel.DistributedDataParallel(_net())
        _train(model, rank, 2)
        pids = [None, None]
        dist.all_gather_object(pids, os.getpid())
        if rank == 1:
            log0, dump0 = Path(log_dir) / "rank0.jsonl", dump_path(Path(log_dir), 0)

            def step2_done() -> bool:  # rank 0 wrote step 2: it is in step 3
                return log0.exists() and any(s.step == 2 for s in read_rank_log(log0).script_steps)

            _wait(step2_done, "step 2 record from rank 0")

            def signalled() -> bool:  # until rank 0's dump shows it inside the allreduce
                os.kill(pids[0], signal.SIGUSR2)
                time.sleep(0.2)
                return dump0.exists() and _stuck_dump(dump0)

            _wait(signalled, "dump from rank 0 on SIGUSR2")
            out["diagnosis"] = diagnose(load_dumps(Path(log_dir)), 2).summary()
            first = load_dumps(Path(log_dir))[0]["time"]
            request_dumps(Path(log_dir), rank)
            _wait(lambda: load_dumps(Path(log_dir))[0]["time"] > first, "requested dump")
            out["file_trigger"] = load_dumps(Path(log_dir))[0]["reason"]
        _train(model, rank, 1)  # rank 1 joins step 3: rank 0's allreduce completes
        session().finish()
        return out
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(300)
def test_flight_recorder_dumps_on_demand_while_blocked(tmp_path) -> None:
    log_dir = tmp_path / "logs"
    results = run_ranks(_hang_ranks, 2, tmp_path, str(log_dir), timeout_s=240)
    assert results[1]["diagnosis"].startswith(
        "rank 1 missing at step 3 (allreduce of bucket 0, seq 2)"
    ), results[1]["diagnosis"]
    assert "rank 0 still waiting" in results[1]["diagnosis"]
    assert results[1]["file_trigger"] == "requested"
    # At exit each rank leaves its final dump: every collective completed.
    dumps = load_dumps(log_dir)
    assert {d["reason"] for d in dumps.values()} == {"exit"}
    assert diagnose(dumps, 2).stuck_seq is None


@pytest.mark.timeout(300)
def test_bench_measures_every_variant() -> None:
    from ddp.instrument.bench import VARIANTS, BenchConfig, run

    out = run(BenchConfig(rounds=2, steps=1, warmup=0, width=16, depth=2, batch=4))
    for clock in ("wall", "cpu"):
        assert set(out[clock]) == set(VARIANTS)
        assert out[clock]["plain"]["overhead"] == 0
        assert all(out[clock][v]["ms"] > 0 for v in VARIANTS)
