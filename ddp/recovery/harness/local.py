"""``python -m ddp --recovery live``: a live job on this host, as the lab runs one in
containers. The job's etcd on loopback and the launcher's decider (the process named
``coordinator``), then one ``python -m ddp train --recovery live`` process per rank; with
``--kill-rank R --kill-at-step S`` rank R is SIGKILLed once it committed step S-1 (so the kill
lands in step S), and with ``--rejoin`` a replacement for it starts once the survivors
committed a step without it. The ranks' typed records (``@ddp`` lines) drive the fault
injection and the timeline printed at the end; group rank 0's table and the decider's lines
are passed through as they come.

Exit 0 only if every rank that was not killed exited 0 (its live verdict held) and all of
them ended with bitwise-identical parameters.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

from ddp.program.config import TrainConfig
from ddp.program.records import EndRecord, Record, load_attempts, parse_record_line
from ddp.recovery.demo.timeline import figures, figures_line, timeline
from ddp.recovery.harness.launch import local_job
from ddp.recovery.protocol.messages import SECRET_ENV, SECRET_FILE_ENV
from ddp.recovery.records import CommitRecord, QuorumRecord, RecoveryVerdictRecord

__all__ = ["LocalJob", "run_local"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _follow(name: int | str, stream: IO[str], out: queue.Queue, text: IO[str] | None) -> None:
    """Records go to ``out``; other lines to ``text`` (stdout when None) as they come."""
    for line in stream:
        record = parse_record_line(line)
        if record is not None:
            out.put((name, record))
        elif line.strip():
            (text or sys.stdout).write(line)
            (text or sys.stdout).flush()


class LocalJob:
    """The coordinator and rank processes of one local live run; ``output``: where their
    human-readable output goes (None: this process's stdout and stderr)."""

    def __init__(
        self,
        cfg: TrainConfig,
        world: int,
        log_dir: str,
        follow: bool = True,
        output: IO[str] | None = None,
    ) -> None:
        self.cfg, self.world, self.log_dir, self.output = cfg, world, log_dir, output
        self.port = _free_port()
        self.records: queue.Queue = queue.Queue()
        self.events: list[Record] = []
        self.extra: list[tuple[float, str]] = []
        self.entered: set[str] = set()  # processes that trained in a quorum
        self.victim: str | None = None  # the rank the fault hit
        self.procs: dict[str, subprocess.Popen] = {}
        self.followers: list[threading.Thread] = []  # one per process, until its stdout ends
        self.rank_cfg = cfg.replace(log_dir=log_dir, emit_records=follow)
        # A reused --log-dir holds an earlier run's files (this run's go beside them, as the
        # next attempts): the report judges this run's alone.
        self.earlier = frozenset(Path(log_dir).glob("rank*.jsonl"))
        # The job's secret, for every process alike: in their environment, which other users
        # cannot read (a command line they can, in ps).
        self.env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.env[SECRET_ENV] = secrets.token_hex(16)
        self.env.pop(SECRET_FILE_ENV, None)
        self.env["GLOO_SOCKET_IFNAME"] = "lo"  # the ranks' gloo listeners: loopback too
        self._control = contextlib.ExitStack()  # the job's etcd, until stop()
        self.start_server()

    def start_server(self) -> None:
        """The job's control plane: its own etcd on loopback (``local_job``), then the
        launcher's decider, as the process named ``coordinator``."""
        hb = self.cfg.heartbeat_timeout_s
        self.env, decider = self._control.enter_context(local_job(self.world, hb))
        timeout = f"{max(300.0, self.cfg.steps * 10.0):g}"
        self._start("coordinator", *decider, "--timeout", timeout)

    def _start(self, name: str, *argv: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start process ``name``, in a process group of its own (``stop`` ends the group;
        a Ctrl-C reaches only this launcher, which stops them all); ``env``: added to the
        job's."""
        p = subprocess.Popen(
            [sys.executable, *argv],
            stdout=subprocess.PIPE,
            text=True,
            env={**self.env, **(env or {})},
            bufsize=1,
            start_new_session=True,
            stderr=self.output,
        )
        self.procs[name] = p
        follow = (name, p.stdout, self.records, self.output)
        self.followers.append(threading.Thread(target=_follow, args=follow, daemon=True))
        self.followers[-1].start()
        return p

    def start_rank(self, rank: int, name: str, env: dict[str, str] | None = None) -> None:
        argv = ["--rank", str(rank), "--world-size", str(self.world), *self.rank_cfg.to_argv()]
        self._start(name, "-m", "ddp", "train", *argv, env=env)

    def ranks_running(self) -> bool:
        """Whether a rank still trains (a replacement still starting up when every other rank
        is done does not count: it is stopped, too late to join)."""
        gone = ("coordinator", self.victim)
        running = [n for n, p in self.procs.items() if n not in gone and p.poll() is None]
        return any(not n.endswith("+") or n in self.entered for n in running)

    def drain(self) -> list[tuple[str, Record]]:
        """The records that arrived since the last call, by process name; each is kept in
        ``events``, and a process that entered a quorum is marked in ``entered``."""
        got = []
        while True:
            try:
                name, record = self.records.get_nowait()
            except queue.Empty:
                return got
            self.events.append(record)
            if isinstance(record, QuorumRecord):
                self.entered.add(name)
            got.append((name, record))

    def stop(self) -> None:
        """SIGKILL every process group still running (a stopped process too) and reap it;
        then every line they wrote has been handled (``records``, ``output``)."""
        for p in self.procs.values():
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
        for t in self.followers:
            t.join(timeout=10)
        self._control.close()


def _drive(
    job: LocalJob,
    kill: tuple[int, int] | None,
    sig: signal.Signals,
    rejoin: bool,
    deadline: float,
    kill_coordinator: int | None = None,
) -> tuple[float | None, float | None]:
    """Run until every rank exited; inject the faults; returns the wall-clock times of the
    rank's kill and of the coordinator's."""
    t_kill = t_coordinator = None
    while job.ranks_running() or not job.records.empty():
        if time.monotonic() > deadline:
            raise TimeoutError("the live run did not finish in time")
        for name, r in job.drain():
            done = isinstance(r, CommitRecord) and r.committed
            at = kill_coordinator
            now = at is not None and (at == 1 or (done and r.step == at - 1))
            if now and t_coordinator is None:
                job.procs["coordinator"].kill()
                t_coordinator = time.time()
                job.extra.append((t_coordinator, f"coordinator sent SIGKILL in step {at}"))
            # Once it committed step S-1: the kill lands in step S itself.
            hit = done and r.step == kill[1] - 1 if kill else False
            if kill and t_kill is None and name == str(kill[0]) and (hit or kill[1] == 1):
                job.procs[name].send_signal(sig)
                t_kill, job.victim = time.time(), name
                job.extra.append((t_kill, f"rank {kill[0]} sent {sig.name} in step {kill[1]}"))
            late = t_kill is not None and done and r.world_size == job.world - 1
            if rejoin and late and f"{kill[0]}+" not in job.procs:
                job.extra.append((time.time(), f"replacement for rank {kill[0]} started"))
                job.start_rank(kill[0], f"{kill[0]}+")
        time.sleep(0.005)
    return t_kill, t_coordinator


def _report(
    job: LocalJob,
    t_kill: float | None,
    kill: tuple[int, int] | None,
    t_coordinator: float | None = None,
) -> int:
    # The files are complete and also hold what no fault injection needed to follow.
    logs = load_attempts(Path(job.log_dir), skip=job.earlier)
    job.events = [rec for attempts in logs.values() for log in attempts for rec in log.records]
    ends = [r for r in job.events if isinstance(r, EndRecord)]
    verdicts = [r for r in job.events if isinstance(r, RecoveryVerdictRecord)]
    t0 = t_coordinator or t_kill or min((r.t for r in job.events if hasattr(r, "t")), default=0)
    what = f"seconds after the fault on rank {kill[0]}" if t_kill else "seconds"
    what = "seconds after the coordinator's SIGKILL" if t_coordinator else what
    print(f"{job.cfg.recovery} recovery timeline ({what}):")
    for line in timeline(job.events, t0, job.extra):
        print(line)
    survivors = {n: p.returncode for n, p in job.procs.items() if n not in ("coordinator",)}
    if kill:
        survivors.pop(str(kill[0]), None)
    for n in [n for n in survivors if n.endswith("+") and n not in job.entered]:
        if survivors[n] == 3 or survivors[n] < 0:  # refused, or stopped while starting
            print(f"the replacement for rank {n[:-1]} started too late: the run ended first")
            survivors.pop(n)
    codes_ok = all(c == 0 for c in survivors.values())
    digests = {e.params_sha256 for e in ends}
    if t_kill is not None:
        f = figures(job.events, t_kill, job.world)
        print(figures_line(f, kill, job.world))
    if t_coordinator is not None:
        print(_coordinator_line(figures(job.events, t_coordinator, job.world)))
    # The verdict of a rank that lived through every quorum: a replacement's says only what
    # it saw after it joined (0 failed attempts, 1 quorum).
    whole = max(verdicts, key=lambda v: (v.quorums, v.failed_attempts), default=None)
    message = whole.message if whole else "no rank reached the end"
    ok = codes_ok and len(digests) == 1 and len(ends) >= len(survivors) and bool(verdicts)
    ok = ok and all(v.holds for v in verdicts)
    if job.cfg.recovery == "torchft":  # its replicas compared from their step records
        from ddp.recovery.demo.torchft.verdict import agreement

        holds, said = agreement(job.events)
        ok, message = ok and holds, f"{message}, {said}"
    same = (
        f"{len(ends)} replicas bitwise identical at the end"
        if len(digests) == 1
        else (f"replicas DIFFER at the end ({len(digests)} digests)")
    )
    exits = ", ".join(f"rank {n} {c}" for n, c in sorted(survivors.items()))
    if any(c == 5 for c in survivors.values()):  # no verdict can hold: nothing guarded the run
        print(f"live recovery stopped: the job's etcd was lost (exit codes: {exits})")
        return 5
    print(f"{message}; {same} (exit codes: {exits})")
    return 0 if ok else (3 if any(c == 3 for c in survivors.values()) else 1)


def _coordinator_line(f: dict) -> str:
    def s(v: float | None) -> str:
        return "never" if v is None else f"{v:.3f} s"

    step = f["first_commit_step"]
    at = f" (step {step} at world {f['first_commit_world']})" if step is not None else ""
    return (
        f"coordinator SIGKILL -> noticed {s(f['noticed_s'])}, -> new quorum "
        f"{s(f['quorum_s'])}, -> first committed step {s(f['first_commit_s'])}{at}"
    )


def run_local(cfg: TrainConfig, args: argparse.Namespace, kind: type[LocalJob] = LocalJob) -> int:
    """The whole local live run; its exit code. ``kind``: the job's processes (``TorchftJob``
    puts torchft's lighthouse where our coordinator runs)."""
    log_dir = cfg.log_dir or tempfile.mkdtemp(prefix="ddp-live-")
    kill = (args.kill_rank, args.kill_at_step) if args.kill_rank is not None else None
    # A terminated launcher still stops its processes (the finally below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # Records are followed live only to time a fault: a run without one reads them at the end.
    at = getattr(args, "kill_coordinator_at_step", None)
    job = kind(cfg, args.world_size, log_dir, follow=kill is not None or at is not None)
    try:
        for r in range(args.world_size):
            job.start_rank(r, str(r))
        deadline = time.monotonic() + max(300.0, cfg.steps * 10.0)
        sig = signal.Signals[f"SIG{args.signal}"]
        t_kill, t_coordinator = _drive(job, kill, sig, args.rejoin, deadline, at)
        job.stop()
        return _report(job, t_kill, kill, t_coordinator)
    finally:
        job.stop()
        print(f"records: {log_dir}", file=sys.stderr)
