"""What ``lab kill --launcher torchrun`` found, judged: plain data in, checks and lines out.

:func:`judge` decides from what the run handed over (:mod:`.torchrun_result`) alone whether
torchrun recovered: the reference ran clean, the kill landed, every rank was set up again after
it, the new workers resumed from a checkpoint that existed before the fault, the restarted run
ended with every torchrun exiting 0 and parity holding, and every rank's final parameters equal
the reference's bit for bit (:func:`lab.experiments.kill.torchrun.restarts.compare_final`). Pure:
tested from synthetic values as well as from a real run; ``report.json`` holds all of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ddp.torchfree import ConfigRecord, RankLog, VerdictRecord
from lab.engine.events import Event, RecordEvent
from lab.experiments.kill.torchrun.plan import TorchrunKillPlan
from lab.experiments.kill.torchrun.restarts import (
    Recovered,
    compare_final,
    compare_survivors,
    restart_timeline,
)
from lab.experiments.kill.torchrun.result import JobOutcome, TorchrunKillResult, WorkerKill

__all__ = ["Check", "TorchrunSummary", "Verdict", "analyse", "judge"]


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
            "bitwise_equal": self.recovered.ok and self.recovered.bitwise,
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
    """Every check from what the run handed over, the timeline, and the bitwise verdict."""
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
        ),
        _kill_check(kill),
    ]
    fault_t = result.fault.started if kill is None else kill.start
    restarted, verdict = _after_fault(result.events, fault_t)
    after = plan.survivors  # the new world's ranks: all, or those of the hosts left
    missing = sorted(set(range(after)) - set(restarted))
    checks.append(
        Check(
            kill is not None and not missing,
            f"torchrun restarted the worker group: every rank of a world of {after} set up again "
            "after the fault"
            if not missing
            else f"ranks {missing} were not set up again after the fault (of {after})",
        )
    )
    checks.append(_resumed_check(plan, restarted, result.attempt_steps))
    holds = verdict is not None and verdict.holds
    said = verdict.message if verdict is not None else "no verdict after the fault"
    ended = _survived(result.fault, plan.lost) if plan.lost else result.fault.clean
    checks.append(Check(ended and holds, _ended(result.fault, "restarted run") + f"; {said}"))
    return Verdict(
        restart_timeline(result.events, fault_t, kill.what if kill else "none"),
        checks,
        compare_survivors(run_logs, after) if plan.lost else compare_final(ref_logs, run_logs),
        restarted,
        _shas(world, ref_logs, run_logs),
        None if kill is None else kill.start - result.fault.started,
    )


def _survived(job: JobOutcome, lost: tuple[int, ...]) -> bool:
    """The lost host's torchruns died with it; every other one exited 0."""
    codes = job.codes
    gone = all(codes.get(n, 0) != 0 for n in lost)
    return not job.running and gone and all(c == 0 for n, c in codes.items() if n not in lost)


def _kill_check(kill: WorkerKill | None) -> Check:
    if kill is None:
        return Check(False, "fault: no worker was killed")
    said = f" ({kill.output.strip()})" if kill.output.strip() else ""
    return Check(
        kill.code == 0,
        f"fault: {kill.what} when {kill.trigger}; kill exited {kill.code}{said}, "
        f"{kill.start - kill.trigger_time:.2f} s after the record arrived",
    )


def _after_fault(
    events: list[Event], fault_t: float
) -> tuple[dict[int, int], VerdictRecord | None]:
    """Per rank the step its first set-up after the fault resumed after; rank 0's verdict."""
    restarted: dict[int, int] = {}
    verdict: VerdictRecord | None = None
    for e in events:
        if isinstance(e, RecordEvent) and e.t >= fault_t:
            if isinstance(e.record, ConfigRecord):
                restarted.setdefault(e.record.rank, e.record.start_step)
            elif isinstance(e.record, VerdictRecord) and e.record.rank == 0:
                verdict = e.record
    return restarted, verdict


def _shas(
    world: int, ref_logs: Mapping[int, RankLog], run_logs: Mapping[int, RankLog]
) -> dict[int, tuple[str | None, str | None]]:
    """Per rank the final parameters' sha256, (reference, restarted); None: no end record."""
    ranks = sorted(set(range(world)) | set(ref_logs) | set(run_logs))
    return {
        r: tuple(
            logs[r].end.params_sha256 if r in logs and logs[r].end else None
            for logs in (ref_logs, run_logs)
        )
        for r in ranks
    }  # type: ignore[misc]


def _resumed_check(
    plan: TorchrunKillPlan, restarted: dict[int, int], attempt_steps: dict[int, list[int]]
) -> Check:
    """The new workers agree on one start, a checkpoint that existed before the fault: at most
    the last step every rank had logged in its first attempt (that step's checkpoint may
    still have been in writing, so an older one is no failure)."""
    starts = sorted(set(restarted.values()))
    if plan.lost:
        ok = starts == [0]
        return Check(
            ok,
            "the new world started fresh (step 0), as asked (--checkpoint-every 0)"
            if ok
            else f"the new world did not start at step 0 together: steps {starts}",
        )
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


@dataclass
class TorchrunSummary:
    """The verdict, and the run it was judged from: ``report.json``, the console text and the
    page are each built from it."""

    result: TorchrunKillResult
    verdict: Verdict


def analyse(result: TorchrunKillResult) -> TorchrunSummary:
    return TorchrunSummary(result, judge(result))
