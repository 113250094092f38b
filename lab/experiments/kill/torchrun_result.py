"""What ``lab kill --launcher torchrun`` found, judged: plain data in, checks and lines out.

The run hands over what happened (the jobs' exits, lab's kill, the faulted job's typed
events, the collected logs); :func:`judge` decides from those alone whether torchrun recovered:
the reference ran clean, the kill landed, every rank was set up again after it, the new
workers resumed from a checkpoint that existed before the fault, the restarted run ended with
every torchrun exiting 0 and parity holding, and every rank's final parameters equal the
reference's bit for bit (:func:`lab.restarts.compare_final`). Pure: tested from synthetic
values as well as from a real run; ``report.json`` holds all of it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ddp.torchfree import ConfigRecord, RankLog, VerdictRecord
from lab.engine.events import Event, RecordEvent
from lab.experiments.kill.torchrun_plan import TorchrunKillPlan
from lab.restarts import Recovered, compare_final, restart_timeline

__all__ = ["Check", "JobOutcome", "TorchrunKillResult", "Verdict", "WorkerKill", "judge"]


@dataclass(frozen=True)
class WorkerKill:
    """Lab's kill of one worker process (host ``time.time()``)."""

    rank: int
    node: int
    pid: int  # in the node's pid namespace, from the rank's set-up record
    trigger: str  # what lab saw, e.g. "rank 3 reported step 4 done"
    trigger_time: float
    start: float  # just before the docker exec of kill
    end: float  # when it returned
    code: int  # kill's exit code in the node: 0, the signal was sent
    output: str = ""

    @property
    def what(self) -> str:
        return f"SIGKILL rank {self.rank}'s worker (pid {self.pid}) on node{self.node}"


@dataclass(frozen=True)
class JobOutcome:
    """How a torchrun job ended: torchrun's exit code per node, nodes still running."""

    name: str
    started: float
    ended: float | None  # the last exit
    codes: dict[int, int]
    running: list[int] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.running and bool(self.codes) and all(c == 0 for c in self.codes.values())

    @property
    def seconds(self) -> float | None:
        return None if self.ended is None else self.ended - self.started


@dataclass
class TorchrunKillResult:
    plan: TorchrunKillPlan
    run_id: str
    run_dir: Path
    reference: JobOutcome
    fault: JobOutcome
    kill: WorkerKill | None
    events: list[Event]  # the faulted job's, in arrival order
    logs: dict[str, dict[int, RankLog]]  # phase -> rank -> its newest attempt
    attempt_steps: dict[int, list[int]]  # fault phase: rank -> last step of each attempt
    seconds: float = 0.0  # containers created to removed


@dataclass(frozen=True)
class Check:
    ok: bool
    text: str


@dataclass
class Verdict:
    timeline: list[str]
    checks: list[Check]
    recovered: Recovered
    restarted: dict[int, int]  # rank -> the step it resumed after, from its first set-up after
    shas: dict[int, tuple[str | None, str | None]]  # rank -> (reference, restarted)
    fault_at_s: float | None  # the kill, seconds into the faulted job

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks) and self.recovered.ok

    def lines(self) -> list[str]:
        at = "" if self.fault_at_s is None else f"; the fault came {self.fault_at_s:.2f} s in"
        out = [f"restart timeline (seconds from the fault{at}):", *self.timeline, "checks:"]
        out += [f"  {'ok  ' if c.ok else 'FAIL'}  {c.text}" for c in self.checks]
        pairs = [
            f"rank {r} {(b or '-')[:12]}.. {'=' if a and a == b else '!='} {(a or '-')[:12]}.."
            for r, (a, b) in sorted(self.shas.items())
        ]
        out.append(
            "sha256 of the final parameters, restarted vs uninterrupted: " + "; ".join(pairs)
        )
        out.append(self.recovered.line)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "fault_at_s": self.fault_at_s,
            "timeline": self.timeline,
            "checks": [asdict(c) for c in self.checks],
            "restarted": {str(r): s for r, s in sorted(self.restarted.items())},
            "resumed_after": self.recovered.resumed_after,
            "bitwise_equal": self.recovered.ok,
            "recovered": self.recovered.line,
            "final_params_sha256": {
                str(r): {"reference": a, "restarted": b, "equal": a is not None and a == b}
                for r, (a, b) in sorted(self.shas.items())
            },
        }


def _ended(job: JobOutcome, what: str) -> str:
    codes = ", ".join(f"node{n} {c}" for n, c in sorted(job.codes.items())) or "none"
    took = "" if job.seconds is None else f" after {job.seconds:.1f} s"
    still = f", still running at the deadline: nodes {job.running}" if job.running else ""
    return f"{what}: torchrun's exit codes {codes}{took}{still}"


def judge(result: TorchrunKillResult) -> Verdict:
    plan, kill, world = result.plan, result.kill, result.plan.layout.world_size
    ref_logs, run_logs = result.logs.get("reference", {}), result.logs.get("fault", {})
    ref_parity = [r for r in range(world) if r in ref_logs and ref_logs[r].end is not None]
    checks = [
        Check(
            result.reference.clean
            and len(ref_parity) == world
            and all(ref_logs[r].end.parity for r in ref_parity),
            _ended(result.reference, "reference (uninterrupted)")
            + f"; {len(ref_parity)} of {world} ranks ended",
        )
    ]
    if kill is None:
        checks.append(Check(False, "fault: no worker was killed"))
        fault_t = result.fault.started
    else:
        said = f" ({kill.output.strip()})" if kill.output.strip() else ""
        checks.append(
            Check(
                kill.code == 0,
                f"fault: {kill.what} when {kill.trigger}; kill exited {kill.code}{said}, "
                f"{kill.start - kill.trigger_time:.2f} s after the record arrived",
            )
        )
        fault_t = kill.start
    restarted: dict[int, int] = {}
    verdict: VerdictRecord | None = None
    for e in result.events:
        if isinstance(e, RecordEvent) and e.t >= fault_t:
            if isinstance(e.record, ConfigRecord):
                restarted.setdefault(e.record.rank, e.record.start_step)
            elif isinstance(e.record, VerdictRecord) and e.record.rank == 0:
                verdict = e.record
    missing = sorted(set(range(world)) - set(restarted))
    checks.append(
        Check(
            kill is not None and not missing,
            "torchrun restarted the worker group: every rank set up again after the fault"
            if not missing
            else f"ranks {missing} were not set up again after the fault (of {world})",
        )
    )
    checks.append(_resumed_check(plan, restarted, result.attempt_steps))
    holds = verdict is not None and verdict.holds
    said = verdict.message if verdict is not None else "no verdict after the fault"
    checks.append(
        Check(result.fault.clean and holds, _ended(result.fault, "restarted run") + f"; {said}")
    )
    ranks = sorted(set(range(world)) | set(ref_logs) | set(run_logs))
    shas = {
        r: tuple(
            logs[r].end.params_sha256 if r in logs and logs[r].end else None
            for logs in (ref_logs, run_logs)
        )
        for r in ranks
    }
    return Verdict(
        restart_timeline(result.events, fault_t, kill.what if kill else "none"),
        checks,
        compare_final(ref_logs, run_logs),
        restarted,
        shas,  # type: ignore[arg-type]
        None if kill is None else kill.start - result.fault.started,
    )


def _resumed_check(
    plan: TorchrunKillPlan, restarted: dict[int, int], attempt_steps: dict[int, list[int]]
) -> Check:
    """The new workers agree on one start, a checkpoint that existed before the fault: at most
    the last step every rank had logged in its first attempt (that step's checkpoint may
    still have been in writing, so an older one is no failure)."""
    starts = sorted(set(restarted.values()))
    firsts = [steps[0] for steps in attempt_steps.values() if steps]
    done = min(firsts) if firsts else 0
    every = plan.train.checkpoint_every
    newest = done - done % every
    if len(starts) != 1:
        return Check(False, f"the restarted workers did not agree on a start: steps {starts}")
    after = starts[0]
    ok = 0 < after <= done and (after % every == 0 or after == plan.train.steps)
    how = f"resumed after step {after}" if after else "started fresh (step 0)"
    return Check(
        ok,
        f"the restarted workers {how}: checkpoints every {every} steps, every rank had logged "
        f"step {done} before the fault (newest checkpoint then: step {newest})",
    )


def write_report(result: TorchrunKillResult, verdict: Verdict) -> Path:
    plan = result.plan
    data = {
        "run_id": result.run_id,
        "ok": verdict.ok,
        "seconds": round(result.seconds, 3),
        "plan": {
            "launcher": "torchrun",
            "mode": plan.mode,
            "rank": plan.rank,
            "at_step": plan.at_step,
            "nodes": plan.nodes,
            "procs_per_node": plan.procs_per_node,
            "max_restarts": plan.max_restarts,
            "run_timeout_s": plan.run_timeout_s,
            "image": plan.image,
            "train": plan.config("fault").to_dict(),
        },
        "kill": asdict(result.kill) if result.kill else None,
        "phases": {
            job.name: {
                "started": job.started,
                "seconds": job.seconds,
                "exit_codes": {str(n): c for n, c in sorted(job.codes.items())},
                "running": job.running,
            }
            for job in (result.reference, result.fault)
        },
        "attempt_steps": {str(r): s for r, s in sorted(result.attempt_steps.items())},
        **verdict.to_dict(),
    }
    path = result.run_dir / "report.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    return path
