"""``python -m ddp.recovery.harness.launch``: any training script on ``ddp.recovery.api``, run
locally as a live job with a fault injected: the job's etcd and decider, one process per
replica, and the same timeline and figures as ``python -m ddp --recovery live`` prints, from
the replicas' typed records.

    python -m ddp.recovery.harness.launch --world-size 3 --kill-rank 1 --kill-at-step 6 --rejoin \\
        examples/recovery_loop.py --steps 200 --compute-ms 40

Each replica runs ``python SCRIPT ARGS... --records FILE`` with ``RANK``, the job's etcd
(``DDP_ETCD_ENDPOINTS``, ``DDP_ETCD_CREDENTIALS``) and ``DDP_RECOVERY_SECRET`` in its
environment; the script hands ``--records`` to its ``Manager`` (``record=``), one JSON record
a line (the example does). The kill lands once the victim committed step S-1; the replacement
starts once a step was committed without it. Exit 0 if every replica that was not killed
exited 0.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from ddp.program.records import Record, load_attempts, log_name, parse_record_line
from ddp.recovery.demo.timeline import figures, figures_line, timeline
from ddp.recovery.etcd.cluster import EmbeddedEtcd
from ddp.recovery.etcd.decider import JOB_ENV
from ddp.recovery.protocol.messages import SECRET_ENV, SECRET_FILE_ENV
from ddp.recovery.records import CommitRecord

__all__ = ["local_job", "main"]


@contextlib.contextmanager
def local_job(
    world_size: int, heartbeat_timeout_s: float = 2.0
) -> Iterator[tuple[dict[str, str], list[str]]]:
    """A live job's control plane on this host, for as long as the block runs: its own etcd
    (three members on loopback, mutual TLS with a CA made for this job, in a temporary
    directory removed at the end). Yields the environment of every process of the job (where
    etcd is and the job's credentials, a fresh secret and job id, gloo kept on loopback: in the
    environment, which other users cannot read, never on a command line) and the arguments of
    the launcher's decider, which must start first."""
    with EmbeddedEtcd() as etcd:
        token = secrets.token_hex(16)
        env = {
            **os.environ,
            **etcd.env(),
            "OMP_NUM_THREADS": "1",
            SECRET_ENV: token,
            JOB_ENV: f"job-{token[:8]}",
            "GLOO_SOCKET_IFNAME": "lo",
        }
        env.pop(SECRET_FILE_ENV, None)
        argv = ["-m", "ddp.recovery.etcd.decider", "--world-size", str(world_size)]
        yield env, [*argv, "--heartbeat-timeout", f"{heartbeat_timeout_s:g}"]


class _Tail:
    """The complete lines a replica added to its record file since the last read."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0

    def records(self) -> list[Record]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        lines = complete.decode().splitlines()
        return [r for r in (parse_record_line(f"@ddp {line}") for line in lines) if r]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ddp.recovery.harness.launch", description=__doc__)
    p.add_argument("--world-size", type=int, required=True, help="replicas (>= 2)")
    p.add_argument("--kill-rank", type=int, metavar="R", help="SIGKILL replica R ...")
    p.add_argument("--kill-at-step", type=int, metavar="S", help="... once it starts step S")
    p.add_argument("--rejoin", action="store_true", help="then start a replacement for it")
    p.add_argument("--heartbeat-timeout", type=float, default=2.0, help="seconds (default 2)")
    p.add_argument("--log-dir", help="where the records go (default: a new temporary directory)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds at most (default 600)")
    p.add_argument("script", help="the training script, then its own arguments")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    kill = (a.kill_rank, a.kill_at_step)
    if a.world_size < 2:
        p.error(f"--world-size must be >= 2, got {a.world_size}")
    if (kill[0] is None) != (kill[1] is None) or (a.rejoin and kill[0] is None):
        p.error("pass --kill-rank and --kill-at-step together (and both for --rejoin)")
    if kill[0] is not None and not (0 <= kill[0] < a.world_size and kill[1] >= 1):
        p.error(f"--kill-rank must be in 0..{a.world_size - 1} and --kill-at-step >= 1")
    if not Path(a.script).is_file():
        p.error(f"no script at {a.script}")
    log_dir = Path(a.log_dir or tempfile.mkdtemp(prefix="ddp-launch-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    with local_job(a.world_size, a.heartbeat_timeout) as (env, decider):
        return _run(a, kill, log_dir, env, decider)


def _run(
    a: argparse.Namespace,
    kill: tuple[int | None, int | None],
    log_dir: Path,
    env: dict[str, str],
    decider: list[str],
) -> int:
    procs: dict[str, subprocess.Popen] = {}

    def start(name: str, cmd: list[str], rank: int | None = None) -> None:
        extra = {} if rank is None else {"RANK": str(rank)}
        procs[name] = subprocess.Popen([sys.executable, *cmd], env={**env, **extra})

    def replica(rank: int, attempt: int) -> None:
        records = str(log_dir / log_name(rank, attempt))
        start(f"{rank}" + "+" * attempt, [a.script, *a.args, "--records", records], rank)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tails = {r: _Tail(log_dir / log_name(r)) for r in range(a.world_size)}
    t_kill, extra, survivors_at = None, [], a.world_size - 1
    deadline = time.monotonic() + a.timeout
    try:
        start("coordinator", decider)
        for r in range(a.world_size):
            replica(r, 0)
        ranks = [n for n in procs if n != "coordinator"]
        while any(procs[n].poll() is None for n in ranks if n != str(kill[0]) or t_kill is None):
            if time.monotonic() > deadline:
                raise SystemExit(f"the job did not finish within --timeout {a.timeout:g} s")
            for r, tail in tails.items():
                for rec in tail.records():
                    done = isinstance(rec, CommitRecord) and rec.committed
                    if (
                        t_kill is None
                        and r == kill[0]
                        and (kill[1] == 1 or (done and rec.step == kill[1] - 1))
                    ):
                        procs[str(r)].send_signal(signal.SIGKILL)
                        t_kill = time.time()
                        extra.append((t_kill, f"rank {r} sent SIGKILL in step {kill[1]}"))
                    late = t_kill is not None and done and rec.world_size == survivors_at
                    if a.rejoin and late and f"{kill[0]}+" not in procs:
                        extra.append((time.time(), f"replacement for rank {kill[0]} started"))
                        replica(kill[0], 1)
                        ranks.append(f"{kill[0]}+")
            time.sleep(0.01)
    finally:
        for n, proc in procs.items():
            if n == "coordinator":
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
            elif proc.poll() is None:
                proc.kill()
        for proc in procs.values():
            proc.wait()
    events = [
        rec for logs in load_attempts(log_dir).values() for log in logs for rec in log.records
    ]
    t0 = t_kill if t_kill is not None else min((r.t for r in events), default=0.0)
    print(f"live recovery timeline of {Path(a.script).name} (seconds after the fault):")
    for line in timeline(events, t0, extra):
        print(line)
    if t_kill is not None:
        print(figures_line(figures(events, t_kill, a.world_size), kill, a.world_size))
    codes = {n: procs[n].returncode for n in procs if n not in ("coordinator", str(kill[0]))}
    print(f"exit codes: {', '.join(f'rank {n} {c}' for n, c in sorted(codes.items()))}")
    print(f"records: {log_dir}", file=sys.stderr)
    return 0 if all(c == 0 for c in codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
