"""``python -m ddp.recovery.harness.campaign --trials N --seed S``: a fault campaign against live
recovery, each trial a short local live job (``ddp.recovery.harness.local``'s etcd, decider and
rank processes) hit by one fault drawn from the seed:

* ``kill``: SIGKILL of one rank (every rank in turn, the lowest included);
* ``stop``: SIGSTOP of one rank past the heartbeat timeout, then SIGCONT (it is dropped,
  registers again and heals);
* ``coordinator``: SIGKILL of the launcher's decider (the process named ``coordinator``): the
  quorum stands, a member takes the decider role, and the run goes on to the end;
* ``two-kills``: two ranks SIGKILLed at once (world 3 or 4: at 3 only one is left, fewer than
  half, so the job must stop cleanly, exit 3, by design);
* ``heal-kill``: a rank killed and a replacement started, and the healer killed while sending
  it the state (failpoint ``heal.sending``);
* ``vote-kill``: a rank that kills itself between the commit vote and the optimizer step
  (failpoint ``step.voted``);
* ``replacement-dies``: a rank killed and its replacement killed while receiving the state
  (failpoint ``heal.receiving``).

A fault "in step S" lands once the rank it follows has committed step S-1 (its commit record);
failpoints fire at their moment in the code (``ddp.recovery.failpoints``). A replacement is
started with the other ranks and held before it registers (failpoint ``rank.registering``), so
that it joins at the fault, not seconds later, and the trial stays short.

After each trial the records decide (``ddp.recovery.harness.audit``): every step committed once, one
parameter digest per committed step (no split brain), replicas identical at the end, parity
judged, and every process ended as the fault allows. One line per trial as it goes, then per
fault kind the time from the fault to the first quorum formed after it and to the first step
committed in such a quorum (p50, p90, p99), and a last line. Exit 0 only if every trial is
clean. Every trial has a deadline; one that passes it is stopped and counted unclean.

    python -m ddp.recovery.harness.campaign --trials 30 --seed 1
    python -m ddp.recovery.harness.campaign --trials 7 --seed 2 --kinds kill,vote-kill
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ddp.program.config import TrainConfig
from ddp.program.records import load_attempts
from ddp.recovery import failpoints
from ddp.recovery.harness.audit import Expect, Judgement, Process, judge_trial
from ddp.recovery.harness.local import LocalJob
from ddp.recovery.records import CommitRecord, QuorumRecord

__all__ = ["KINDS", "Trial", "main", "percentile", "plan"]

KINDS = {
    "kill": "SIGKILL",
    "stop": "SIGSTOP",
    "coordinator": "coordinator loss",
    "two-kills": "two SIGKILLs",
    "heal-kill": "kill in a heal",
    "vote-kill": "kill after the vote",
    "replacement-dies": "replacement dies",
}
# Faults after which something must happen before the run ends, so they are drawn early: a
# rank joins (again) and heals; or, after the decider's loss, its lease lapses and a member
# takes the role (a loss late in the run would end with nobody having taken it, unjudged).
_DRAWN_EARLY = ("stop", "heal-kill", "replacement-dies", "coordinator")


@dataclass(frozen=True)
class Trial:
    """One trial of the plan. ``victims``: the ranks the fault hits (for ``heal-kill``: the
    rank killed, then the healer; for ``coordinator``: none); the fault lands in ``step``;
    ``stop_s``: how long a ``stop`` lasts."""

    index: int
    kind: str
    world: int
    step: int
    victims: tuple[int, ...]
    stop_s: float = 0.0

    def describe(self) -> str:
        v, kind = self.victims, self.kind
        if kind == "coordinator":
            what = "SIGKILL of the coordinator"
        elif kind == "two-kills":
            what = f"SIGKILL of ranks {v[0]} and {v[1]}"
        else:
            what = {
                "kill": "SIGKILL of rank {}",
                "stop": f"SIGSTOP of rank {{}} for {self.stop_s:.1f} s",
                "heal-kill": f"rank {{}} killed, healer rank {v[-1]} killed while sending",
                "vote-kill": "rank {} killed between vote and update",
                "replacement-dies": "rank {} killed, its replacement killed while healing",
            }[kind].format(v[0])
        return f"{what} in step {self.step} (world {self.world})"

    @property
    def replacement(self) -> str | None:
        """The name of the replacement process this trial starts (held until the fault)."""
        return f"{self.victims[0]}+" if self.kind in ("heal-kill", "replacement-dies") else None

    def killed(self) -> set[str]:
        """The processes the fault is to kill."""
        v = [str(r) for r in self.victims]
        if self.kind == "replacement-dies":
            return {v[0], f"{v[0]}+"}
        return set() if self.kind in ("stop", "coordinator") else set(v)

    def armed(self) -> dict[str, str]:
        """Each process's ``DDP_FAILPOINT``."""
        spec, v = failpoints.spec, self.victims
        if self.kind == "vote-kill":
            return {str(v[0]): spec("step.voted", step=self.step)}
        if self.kind == "heal-kill":
            return {str(v[1]): spec("heal.sending"), f"{v[0]}+": spec("rank.registering", "stop")}
        if self.kind == "replacement-dies":
            held = spec("rank.registering", "stop") + ";" + spec("heal.receiving")
            return {f"{v[0]}+": held}
        return {}

    def expect(self, steps: int, t_fault: float) -> Expect:
        if self.kind == "coordinator":
            # The quorum stands without a decider and a member takes the role (its state is
            # in etcd): training goes on to the end, and no quorum needs forming.
            return Expect("survive", steps, t_fault, decider_lost=True)
        if self.kind == "two-kills" and 2 * (self.world - 2) < self.world:
            return Expect("stop", steps, t_fault, frozenset({3}))
        return Expect("survive", steps, t_fault)


def plan(
    trials: int, seed: int, kinds: list[str], world: int, steps: int, heartbeat_s: float
) -> list[Trial]:
    """The campaign's trials, the same for the same arguments: the kinds in shuffled rounds
    (each kind once per round), each kind's victims in shuffled rounds of every rank."""
    rng = random.Random(seed)
    order: list[str] = []
    while len(order) < trials:
        order += rng.sample(kinds, len(kinds))
    bags: dict[tuple[str, int], list[int]] = {}

    def victim(kind: str, w: int) -> int:
        bag = bags.setdefault((kind, w), [])
        if not bag:
            bag += rng.sample(range(w), w)
        return bag.pop()

    out = []
    for i, kind in enumerate(order[:trials], 1):
        w = rng.choice((3, 4)) if kind == "two-kills" and world == 3 else world
        last = max(2, steps // 5) if kind in _DRAWN_EARLY else steps - 3
        step = rng.randint(2, last)
        stop_s = round(heartbeat_s * rng.uniform(1.2, 2.0), 2) if kind == "stop" else 0.0
        if kind == "coordinator":
            victims: tuple[int, ...] = ()
        elif kind == "two-kills":
            first = victim(kind, w)
            victims = (first, rng.choice([r for r in range(w) if r != first]))
        elif kind == "heal-kill":
            first = victim(kind, w)
            victims = (first, min(r for r in range(w) if r != first))  # the healer: see heal
        else:
            victims = (victim(kind, w),)
        out.append(Trial(i, kind, w, step, victims, stop_s))
    return out


def percentile(values: list[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile of ``values`` (not empty)."""
    ranked = sorted(values)
    return ranked[max(0, math.ceil(p / 100 * len(ranked)) - 1)]


@dataclass
class _Result:
    trial: Trial
    judgement: Judgement
    seconds: float
    log_dir: Path
    note: str = ""


class _Run:
    """One trial in progress: the job, the fault, and what happened when."""

    def __init__(self, trial: Trial, cfg: TrainConfig, log_dir: Path) -> None:
        self.trial, self.cfg, self.log_dir = trial, cfg, log_dir
        self.fired_log = log_dir / "failpoints.jsonl"
        self.output: IO[str] | None = None
        self.job: LocalJob | None = None
        self.t_fault: float | None = None
        self.struck = False  # the trial's own signal (or setup kill) was sent
        self.note = ""  # what differs from the plan
        self.cont_at: float | None = None  # when to SIGCONT a stopped rank
        self.held_pid: int | None = None  # the replacement, once held at rank.registering
        self.exit_t: dict[str, float] = {}

    def start(self) -> None:
        """The coordinator, the ranks, and a replacement held before it registers."""
        self.log_dir.mkdir(parents=True)
        # The processes' human-readable output (tables, tracebacks): kept beside the records.
        self.output = open(self.log_dir / "output.txt", "w")  # noqa: SIM115 (see close)
        self.job = LocalJob(self.cfg, self.trial.world, str(self.log_dir), output=self.output)
        armed = self.trial.armed()
        common = {failpoints.LOG_ENV: str(self.fired_log)}
        if self.trial.replacement:  # first: the fault waits until it is held
            name = self.trial.replacement
            env = {**common, failpoints.ENV: armed[name]}
            self.job.start_rank(self.trial.victims[0], name, env=env)
        for r in range(self.trial.world):
            env = {**common, failpoints.ENV: armed.get(str(r), "")}
            self.job.start_rank(r, str(r), env=env)

    def close(self) -> None:
        """Every process of the trial ended (SIGKILL to each group still there)."""
        if self.job is not None:
            self.job.stop()
        if self.output is not None:
            self.output.close()

    def _signal(self, name: str, sig: signal.Signals) -> None:
        p = self.job.procs[name]
        if p.poll() is None:
            os.kill(p.pid, sig)

    def _strike(self, step: int) -> None:
        """The trial's fault in ``step`` (or, for the failpoint kinds, the kill that leads
        to it)."""
        t, kind = self.trial, self.trial.kind
        self.struck = True
        if step != t.step:
            self.note = f"struck in step {step}"
        if kind == "coordinator":
            self._signal("coordinator", signal.SIGKILL)
        elif kind == "stop":
            self._signal(str(t.victims[0]), signal.SIGSTOP)
            self.cont_at = time.time() + t.stop_s
        elif kind in ("kill", "two-kills"):
            for v in t.victims:
                self._signal(str(v), signal.SIGKILL)
        elif t.replacement:  # held (see _triggered): it registers as the victim dies
            self._signal(str(t.victims[0]), signal.SIGKILL)
            self._signal(t.replacement, signal.SIGCONT)
        if kind in ("coordinator", "stop", "kill", "two-kills"):
            self.t_fault = time.time()

    def _triggered(self, name: str, record: object) -> bool:
        t = self.trial
        if self.struck or t.kind == "vote-kill":
            return False
        if t.replacement and self.held_pid is None:
            return False  # not ready to join yet: the fault comes at a later step
        follow = None if t.kind == "coordinator" else str(t.victims[0])
        done = isinstance(record, CommitRecord) and record.committed
        # At or past it: a rank healed over that step (dropped under load) still gets hit.
        return done and record.step >= t.step - 1 and follow in (None, name)

    def _read_fired(self) -> None:
        for f in failpoints.read_fired(self.fired_log):
            if f.name == "rank.registering":
                self.held_pid = f.pid
            elif self.t_fault is None:
                self.t_fault = f.t

    def drive(self, deadline: float) -> str:
        """Run to the end; "" or why the trial was cut short."""
        size = -1
        while True:
            for name, record in self.job.drain():
                if self._triggered(name, record):
                    self._strike(record.step + 1)
            if self.fired_log.exists() and self.fired_log.stat().st_size != size:
                size = self.fired_log.stat().st_size
                self._read_fired()
            if self.cont_at is not None and time.time() >= self.cont_at:
                self._signal(str(self.trial.victims[0]), signal.SIGCONT)
                self.cont_at = None
            for name, p in self.job.procs.items():
                if p.poll() is not None and name not in self.exit_t:
                    self.exit_t[name] = time.time()
            if not self.job.ranks_running() and self.cont_at is None:
                return ""
            if time.monotonic() > deadline:
                running = [
                    n for n, p in self.job.procs.items() if n != "coordinator" and p.poll() is None
                ]
                return f"hung: still running after the trial's deadline: ranks {', '.join(running)}"
            time.sleep(0.005)

    def processes(self) -> list[Process]:
        """Every rank process with its records (from the log files, complete) and its end."""
        logs = _by_process(load_attempts(self.log_dir))
        killed = self.trial.killed()
        return [
            Process(
                name,
                int(name.rstrip("+")),
                logs.get(name, []),
                p.returncode,
                name in killed,
                self.exit_t.get(name),
            )
            for name, p in self.job.procs.items()
            if name != "coordinator"
        ]


def _by_process(logs: dict) -> dict[str, list]:
    """Each rank's logs by process name: the one that entered quorum 1 is the rank as started
    (``"2"``), a later one its replacement (``"2+"``), which may have started first."""
    out = {}
    for rank, attempts in logs.items():

        def first_quorum(log) -> int:
            q = next((r.quorum_id for r in log.records if isinstance(r, QuorumRecord)), None)
            return 0 if q == 1 else 1

        ordered = sorted(attempts, key=lambda log: (first_quorum(log), log.attempt))
        for i, log in enumerate(ordered):
            out[str(rank) + "+" * i] = log.records
    return out


def _run_trial(trial: Trial, cfg: TrainConfig, base: Path, timeout_s: float) -> _Result:
    log_dir = base / f"trial-{trial.index:03d}"
    t0 = time.monotonic()
    run = _Run(trial, cfg.replace(log_dir=str(log_dir)), log_dir)
    try:
        run.start()
        cut = run.drive(time.monotonic() + timeout_s)
        codes = {n: p.poll() for n, p in run.job.procs.items()}
    finally:
        run.close()
    procs = run.processes()
    for p in procs:  # what was still running at the end was killed by the cleanup above
        p.exit_code = codes.get(p.name)
    if run.t_fault is None:
        why = "the fault never happened"
        if trial.replacement and run.held_pid is None:
            why += " (the replacement never got ready to join before the run ended)"
        elif not run.struck:
            why += f" (step {trial.step - 1} never committed)"
        judgement = Judgement([why])
    else:
        judgement = judge_trial(procs, trial.expect(cfg.steps, run.t_fault))
    if cut:
        judgement.problems.insert(0, cut)
    return _Result(trial, judgement, time.monotonic() - t0, log_dir, run.note)


def _line(r: _Result, total: int) -> str:
    j = r.judgement

    def s(v: float | None) -> str:
        return "never" if v is None else f"{v:.2f} s"

    what = r.trial.describe() + (f", {r.note}" if r.note else "")
    head = f"trial {r.trial.index:>3}/{total}: {KINDS[r.trial.kind]}: {what}: "
    if not j.clean:
        return head + f"UNCLEAN: {'; '.join(j.problems)} (records: {r.log_dir})"
    if j.outcome == "stopped":
        return head + f"clean stop, {s(j.stop_s)} after the fault [{r.seconds:.1f} s]"
    if j.role_s is not None and j.quorum_s is None:
        role = f"a member held the decider role {s(j.role_s)} after the fault"
        return head + f"clean, {role}, no quorum needed [{r.seconds:.1f} s]"
    return (
        head
        + f"clean, fault -> quorum {s(j.quorum_s)} -> commit {s(j.commit_s)} [{r.seconds:.1f} s]"
    )


def _summary(results: list[_Result]) -> list[str]:
    kinds = [k for k in KINDS if any(r.trial.kind == k for r in results)]
    head = f"{'fault':<20} {'trials':>6} {'clean':>5}"
    for what in ("-> quorum", "-> commit"):
        head += f"   {what:>12}{'p50':>6}{'p90':>6}{'p99':>6}"
    lines = [head]
    last = []
    for k in kinds:
        mine = [r for r in results if r.trial.kind == k]
        clean = [r for r in mine if r.judgement.clean]
        row = f"{KINDS[k]:<20} {len(mine):>6} {len(clean):>5}"
        figures = {}
        for what in ("quorum_s", "commit_s"):
            values = [getattr(r.judgement, what) for r in clean]
            values = [v for v in values if v is not None]
            figures[what] = values
            row += "   " + (
                f"{'':>12}{percentile(values, 50):6.2f}{percentile(values, 90):6.2f}"
                f"{percentile(values, 99):6.2f}"
                if values
                else f"{'-':>30}"
            )
        lines.append(row)
        commits, stops = figures["commit_s"], [r.judgement.stop_s for r in clean]
        stops = [v for v in stops if v is not None]
        if commits:
            p50, p99 = percentile(commits, 50), percentile(commits, 99)
            last.append(f"{KINDS[k]} -> commit p50 {p50:.2f} s, p99 {p99:.2f} s")
        elif stops:
            last.append(f"{KINDS[k]} -> clean stop p50 {percentile(stops, 50):.2f} s")
        elif roles := [r.judgement.role_s for r in clean if r.judgement.role_s is not None]:
            # No quorum to form: the run went on as it was while a member took the role.
            p50, p99 = percentile(roles, 50), percentile(roles, 99)
            last.append(f"{KINDS[k]} -> decider role taken p50 {p50:.2f} s, p99 {p99:.2f} s")
        else:
            last.append(f"{KINDS[k]} -> no clean trial")
    n = sum(r.judgement.clean for r in results)
    lines.append(f"campaign: {n} of {len(results)} trials clean; " + "; ".join(last))
    return lines


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ddp.recovery.harness.campaign",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--trials", type=int, default=14, help="trials (default 14)")
    p.add_argument("--seed", type=int, default=0, help="draws the faults (default 0)")
    p.add_argument(
        "--kinds",
        default=",".join(KINDS),
        help=f"comma-separated fault kinds (default all: {','.join(KINDS)})",
    )
    p.add_argument("--world-size", type=int, default=3, help="ranks per trial (default 3)")
    p.add_argument("--steps", type=int, default=40, help="steps per trial (default 40)")
    p.add_argument("--model", default="mini", help="model (default mini)")
    p.add_argument("--step-delay-ms", type=float, default=50.0, help="per step (default 50)")
    p.add_argument(
        "--heartbeat-timeout", type=float, default=1.0, metavar="S", help="seconds (default 1)"
    )
    p.add_argument(
        "--trial-timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="a trial still running after this is stopped and unclean (default 120)",
    )
    p.add_argument("--keep", action="store_true", help="keep the records of clean trials too")
    p.add_argument(
        "--records",
        metavar="DIR",
        help="where each trial's records go, DIR/trial-NNN (default: a new temporary directory)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        p.error(
            f"--kinds: unknown {', '.join(unknown) or '(none given)'}; one of {', '.join(KINDS)}"
        )
    if args.trials < 1:
        p.error(f"--trials must be >= 1, got {args.trials}")
    if args.world_size < 3:
        p.error(
            f"--world-size must be >= 3 (a fault must leave at least half), got {args.world_size}"
        )
    if args.steps < 20:
        p.error(
            f"--steps must be >= 20: a fault and the recovery after it need room, got {args.steps}"
        )
    try:
        cfg = TrainConfig(
            model=args.model,
            steps=args.steps,
            step_delay_ms=args.step_delay_ms,
            recovery="live",
            heartbeat_timeout_s=args.heartbeat_timeout,
            collective_timeout_s=30.0,
            commit_digests=True,  # what tells a split brain
        )
    except ValueError as e:
        p.error(str(e))
    trials = plan(
        args.trials, args.seed, kinds, args.world_size, args.steps, args.heartbeat_timeout
    )
    if args.records:
        base = Path(args.records)
        try:
            base.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            p.error(f"--records {args.records}: cannot create it ({e.strerror})")
        if any(base.glob("trial-*")):
            p.error(
                f"--records {args.records} holds an earlier campaign's trials: give an empty one"
            )
    else:
        base = Path(tempfile.mkdtemp(prefix="ddp-campaign-"))
    # A terminated campaign still stops the trial's processes (each trial's finally).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(
        f"campaign: {args.trials} trials, seed {args.seed}, world {args.world_size}, "
        f"{args.model}, {args.steps} steps, step delay {args.step_delay_ms:g} ms, heartbeat "
        f"timeout {args.heartbeat_timeout:g} s; records in {base}",
        flush=True,
    )
    results: list[_Result] = []
    code = 0
    try:
        for trial in trials:
            r = _run_trial(trial, cfg, base, args.trial_timeout)
            results.append(r)
            print(_line(r, len(trials)), flush=True)
            if r.judgement.clean and not args.keep:
                shutil.rmtree(r.log_dir, ignore_errors=True)
    except KeyboardInterrupt:
        print(f"campaign: interrupted after {len(results)} trials", flush=True)
        code = 130
    if results:
        for line in _summary(results):
            print(line)
    if all(r.judgement.clean for r in results) and not args.keep and not args.records:
        shutil.rmtree(base, ignore_errors=True)
    if code:
        return code
    return 0 if all(r.judgement.clean for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
