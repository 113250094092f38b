"""Diagnosis of a stalled job with real gloo ranks: one of them is SIGKILLed or SIGSTOPped at
iteration 5, and every survivor must name it (synthetic dumps: test_diagnosis.py)."""

import json
import os
import signal
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import pytest

from ddp.flight.diagnosis import diagnose, wait_for_dumps
from ddp.flight.recorder import FlightRecorder

FAULT_RANK = 2
FAULT_ITER = 5
PG_TIMEOUT_S = 5.0
GRACE_S = 1.5
DIAGNOSED_EXIT = 3


def _fault_worker(rank: int, world: int, tmp: str, sig: int) -> None:
    """One rank: allreduce in a loop under a flight recorder; diagnose the fault and exit 3."""
    import torch
    import torch.distributed as dist

    tmp_dir = Path(tmp)
    dump_dir = tmp_dir / "dumps"
    result = tmp_dir / f"result{rank}.json"
    try:
        rec = FlightRecorder(rank, world)
        rec.watch(dump_dir)
        dist.init_process_group(
            "gloo",
            init_method=f"file://{tmp_dir / 'rdzv'}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=PG_TIMEOUT_S),
        )
        t = torch.ones(4096)
        seq = rec.start("broadcast", step=-1, nbytes=t.numel() * 4)
        dist.broadcast(t, src=0)
        rec.complete(seq)
        try:
            for it in range(3 * FAULT_ITER):
                if rank == FAULT_RANK and it == FAULT_ITER:
                    (tmp_dir / "fault_time").write_text(repr(time.time()))
                    os.kill(os.getpid(), sig)
                seq = rec.start("allreduce", step=it, bucket=it % 2, nbytes=t.numel() * 4)
                dist.all_reduce(t)
                rec.complete(seq)
        except RuntimeError as e:  # gloo reports both kinds of failure as RuntimeError
            caught = time.time()
            rec.fail(seq, str(e))
            reason = "timeout" if "timed out" in str(e).lower() else "error"
            rec.dump(dump_dir, reason)
            d = diagnose(wait_for_dumps(dump_dir, world, grace_s=GRACE_S, rank=rank), world)
            out = {
                "caught": caught,
                "diagnosed": time.time(),
                "reason": reason,
                "error": str(e),
                "missing": d.missing_ranks,
                "waiting": d.waiting,
                "step": d.step,
                "op": d.op,
                "summary": d.summary(),
            }
            result.write_text(json.dumps(out))
            sys.exit(DIAGNOSED_EXIT)
        finally:
            rec.stop_watching()
        result.write_text(json.dumps({"finished": True}))
    except SystemExit:
        raise
    except BaseException:
        result.write_text(json.dumps({"crash": traceback.format_exc()}))
        raise


def _run_fault(tmp_path: Path, world: int, sig: int) -> tuple[dict[int, dict], float, list]:
    import torch.multiprocessing as mp

    # A forkserver that imported torch once forks ranks in milliseconds; "spawn" would import
    # torch in every rank, ~6 s more per test on 2 cores. The server holds no threads, so
    # forking it is safe. (The preload list only applies if no forkserver runs yet.)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "ddp.flight.diagnosis"])
    procs = [
        ctx.Process(target=_fault_worker, args=(r, world, str(tmp_path), sig)) for r in range(world)
    ]
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + 45
        for r, p in enumerate(procs):
            if r != FAULT_RANK:  # a stopped rank would never be joined
                p.join(max(0.1, deadline - time.monotonic()))
        codes = [p.exitcode for p in procs]
        results = {}
        for r in range(world):
            f = tmp_path / f"result{r}.json"
            if f.exists():
                results[r] = json.loads(f.read_text())
        assert (tmp_path / "fault_time").exists(), f"rank {FAULT_RANK} never faulted: {codes}"
        fault_time = float((tmp_path / "fault_time").read_text())
        return results, fault_time, codes
    finally:
        for p in procs:
            if p.is_alive():
                # A stopped process ignores everything but SIGKILL; continue it first anyway
                # so nothing is left in the T state if the kill races with the test's exit.
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
                p.join(10)


def _check_survivors(results, fault_time, codes, world: int, reason: str | None) -> list[float]:
    """Every survivor names exactly the faulty rank and step, in time; returns notice delays."""
    survivors = [r for r in range(world) if r != FAULT_RANK]
    for r in survivors:
        assert codes[r] == DIAGNOSED_EXIT, f"rank {r} exit {codes[r]}: {results.get(r)}"
        res = results[r]
        if reason is not None:
            assert res["reason"] == reason, res["error"]
        assert res["missing"] == [FAULT_RANK], res["summary"]
        assert res["step"] == FAULT_ITER and res["op"] == "allreduce"
        assert res["summary"].startswith(f"rank {FAULT_RANK} missing at step {FAULT_ITER} (")
        assert res["diagnosed"] - fault_time < PG_TIMEOUT_S + GRACE_S + 3.0
        print(
            f"[{world} ranks] rank {r}: {res['reason']} {res['caught'] - fault_time:.3f} s after "
            f"the fault, diagnosis {res['diagnosed'] - fault_time:.3f} s after it: "
            f"{res['summary']}"
        )
    return [results[r]["caught"] - fault_time for r in survivors]


@pytest.mark.timeout(60)
def test_sigkilled_rank_is_diagnosed(tmp_path):
    results, fault_time, codes = _run_fault(tmp_path, 3, signal.SIGKILL)
    assert codes[FAULT_RANK] == -signal.SIGKILL
    noticed = _check_survivors(results, fault_time, codes, 3, reason="error")
    # A dead peer closes its sockets: survivors notice long before the timeout would fire.
    assert max(noticed) < PG_TIMEOUT_S


@pytest.mark.timeout(60)
def test_sigstopped_rank_is_diagnosed(tmp_path):
    results, fault_time, codes = _run_fault(tmp_path, 3, signal.SIGSTOP)
    assert codes[FAULT_RANK] is None  # still stopped when the survivors are done
    noticed = _check_survivors(results, fault_time, codes, 3, reason="timeout")
    # A stopped peer keeps its sockets open: only the process group timeout frees the others.
    assert min(noticed) >= PG_TIMEOUT_S - 0.5


@pytest.mark.timeout(60)
def test_sigkill_with_four_ranks_does_not_blame_a_blocked_survivor(tmp_path):
    # With 4 ranks, the ranks talking to rank 2 fail at once, but another survivor may be
    # blocked on a live peer until the timeout. It has not dumped when the first ones
    # diagnose; the dump request makes it answer, so only rank 2 is named.
    results, fault_time, codes = _run_fault(tmp_path, 4, signal.SIGKILL)
    assert codes[FAULT_RANK] == -signal.SIGKILL
    _check_survivors(results, fault_time, codes, 4, reason=None)
