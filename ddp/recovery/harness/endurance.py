"""``python -m ddp.recovery.harness.endurance``: one live run, five faults, and the verdict.

Four local ranks (``ddp.recovery.harness.local``'s processes) train ``--steps`` steps while the plan
below hits them, each fault once rank R has committed the step before:

1. SIGKILL of rank 2 (it stays dead: the run goes on at 3);
2. a pause: rank 1 is SIGSTOPped, its heartbeats stop, it is dropped; SIGCONT after twice the
   heartbeat timeout: it finds itself left out, registers again and heals from a peer;
3. a partition-like stall: the same for rank 3, for four heartbeat timeouts;
4. SIGKILL of rank 0, the reference holder: the lowest survivor takes the reference over;
5. SIGKILL of rank 1 and a replacement started at once, which heals from a peer.

It exits 0 only if every rank still training at the end exits 0 (its verdict: every step
committed exactly once, replicas bitwise identical after every committed step) and all of them
end with the same parameters.

    python -m ddp.recovery.harness.endurance --steps 200 --step-delay-ms 60
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
import time

from ddp.program.config import TrainConfig
from ddp.program.records import EndRecord
from ddp.recovery.demo.timeline import timeline
from ddp.recovery.harness.local import LocalJob
from ddp.recovery.records import CommitRecord, RecoveryVerdictRecord

__all__ = ["main"]


def _plan(steps: int) -> list[tuple[int, int, str]]:
    """(step, rank, what) for the five faults, spread over the run."""
    at = [round(steps * f) for f in (0.1, 0.25, 0.4, 0.55, 0.65)]
    return [
        (at[0], 2, "kill"),
        (at[1], 1, "pause"),
        (at[2], 3, "stall"),
        (at[3], 0, "kill"),
        (at[4], 1, "kill+rejoin"),
    ]


def _hit(job: LocalJob, name: str, what: str, hb: float) -> None:
    p = job.procs[name]
    if what.startswith("kill"):
        p.send_signal(signal.SIGKILL)
        if what == "kill+rejoin":
            job.start_rank(int(name.rstrip("+")), name.rstrip("+") + "+")
        return
    p.send_signal(signal.SIGSTOP)
    wait = hb * (2 if what == "pause" else 4)
    threading.Timer(wait, lambda: p.poll() is None and p.send_signal(signal.SIGCONT)).start()


def _run(job: LocalJob, plan: list, hb: float, deadline: float) -> None:
    pending = list(plan)
    current = {str(r): str(r) for r in range(job.world)}  # rank -> its live process's name
    while job.ranks_running():
        if time.monotonic() > deadline:
            raise TimeoutError("the endurance run did not finish in time")
        for name, r in job.drain():
            done = isinstance(r, CommitRecord) and r.committed
            if pending and done and r.step == pending[0][0] - 1:
                step, rank, what = pending[0]
                if name == current[str(rank)]:
                    pending.pop(0)
                    job.extra.append((time.time(), f"fault: {what} of rank {rank} in step {step}"))
                    _hit(job, name, what, hb)
                    if what == "kill+rejoin":
                        current[str(rank)] = f"{rank}+"
        time.sleep(0.005)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m ddp.recovery.harness.endurance", description=__doc__
    )
    p.add_argument("--steps", type=int, default=200, help="steps (default 200)")
    p.add_argument("--step-delay-ms", type=float, default=60.0, help="per step (default 60)")
    p.add_argument("--model", default="mini", help="model (default mini)")
    p.add_argument("--heartbeat-timeout", type=float, default=1.0, help="seconds (default 1)")
    args = p.parse_args(argv)
    if args.steps < 20:
        p.error("--steps must be >= 20: five faults need room")
    cfg = TrainConfig(
        model=args.model,
        steps=args.steps,
        step_delay_ms=args.step_delay_ms,
        recovery="live",
        heartbeat_timeout_s=args.heartbeat_timeout,
        collective_timeout_s=60.0,
    )
    log_dir = tempfile.mkdtemp(prefix="ddp-endurance-")
    job = LocalJob(cfg, 4, log_dir)
    try:
        for r in range(4):
            job.start_rank(r, str(r))
        _run(job, _plan(args.steps), args.heartbeat_timeout, time.monotonic() + 900)
    finally:
        job.stop()
    t0 = min(r.t for r in job.events if hasattr(r, "t"))
    for line in timeline(job.events, t0, job.extra):
        print(line)
    return _verdict(job, log_dir)


def _verdict(job: LocalJob, log_dir: str) -> int:
    ends = {e.params_sha256 for e in job.events if isinstance(e, EndRecord)}
    verdicts = [v for v in job.events if isinstance(v, RecoveryVerdictRecord)]
    codes = {n: p.returncode for n, p in job.procs.items() if n != "coordinator"}
    finished = len([e for e in job.events if isinstance(e, EndRecord)])
    ok = bool(verdicts) and all(v.holds for v in verdicts) and len(ends) == 1
    print(verdicts[-1].message if verdicts else "no rank reached the end")
    print(
        f"endurance: {finished} ranks finished with {len(ends)} distinct parameter digest(s); "
        f"exit codes {codes}; records in {log_dir}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
