"""``lab kill``'s analysis (the restart path), built from what the run collected: pure, tested
without Docker. :func:`analyse` turns the result into the one :class:`RestartSummary` that
``report.json``, the console text and the page are built from.

Inputs: the fault phase's outcome (exit events, the failure records the ranks wrote), the
flight recorder dumps they left on the shared volume and lab's own record of the injection.
Containers share the host's clock, so the dumps' stamps and lab's sit on one timeline.

The diagnosis is ddp's (:func:`ddp.flight.diagnosis.diagnose` over the dumps); lab adds what only it
knows, which rank it hit and how, and checks that the diagnosis names that rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ddp.torchfree import Diagnosis, diagnose
from lab.experiments.kill.restart.plan import KillPlan
from lab.experiments.kill.restart.recovery import Recovery, compare_runs
from lab.experiments.kill.restart.result import Injection, KillResult, PhaseOutcome
from lab.experiments.kill.words import error_meaning, fmt_s, table

__all__ = [
    "HEADINGS",
    "PEER_FAILURE_EXIT",
    "FaultReport",
    "RankRow",
    "RestartSummary",
    "analyse",
    "build_report",
]

PEER_FAILURE_EXIT = 3  # ddp train's exit code when a peer died, stalled or was cut off
HEADINGS = (
    "rank",
    "node",
    "role",
    "stuck in (collective, step, seq)",
    "waited in it",
    "noticed after fault",
    "what it saw",
    "exit code",
)


@dataclass
class RankRow:
    rank: int
    node: int
    role: str  # "survivor", or what lab did to it
    exit_code: int | None
    stuck_in: str | None  # the collective it was blocked in when it failed or dumped
    waited_s: float | None  # from entering that collective to its failure
    noticed_after_s: float | None  # from lab's fault call to that failure
    saw: str  # the raw error by its meaning, e.g. "the peer closed the connection"
    error: str | None  # the raw error, for report.json
    reported_missing: list[int] | None  # the missing ranks in its failure record

    def cells(self) -> list[str]:
        code = "-" if self.exit_code is None else str(self.exit_code)
        return [
            str(self.rank),
            f"node{self.node}",
            self.role,
            self.stuck_in or "-",
            fmt_s(self.waited_s),
            fmt_s(self.noticed_after_s),
            self.saw or "-",
            code,
        ]


@dataclass
class FaultReport:
    diagnosis: Diagnosis
    ok: bool
    last_line: str  # the closing "diagnosis: ..." line
    rows: list[RankRow]
    timeline: list[tuple[float, str]]  # (seconds since the fault phase started, event)
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """Timeline, per-rank table, notes; one prefix per line (the closing line apart)."""
        out = ["timeline of the fault phase (seconds since its ranks were started):"]
        out += [f"  {t:+8.2f} s  {what}" for t, what in self.timeline]
        out.append("ranks in the fault phase:")
        out += table(HEADINGS, [r.cells() for r in self.rows])
        out += [f"note: {n}" for n in self.notes]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "last_line": self.last_line,
            "diagnosis": asdict(self.diagnosis),
            "ranks": [asdict(r) for r in self.rows],
            "timeline": [{"t_s": round(t, 4), "event": e} for t, e in self.timeline],
            "notes": self.notes,
        }


def _describe(rec: dict) -> str:
    what = rec.get("op") or "collective"
    if rec.get("bucket") is not None:
        what += f" of bucket {rec['bucket']}"
    step = rec.get("step")
    where = f"step {step}" if isinstance(step, int) and step >= 0 else "setup"
    return f"{what}, {where}, seq {rec['seq']}"


def _stuck_record(dump: dict) -> dict | None:
    """The collective a rank was stuck in: its failed one, else its oldest unfinished one."""
    records = dump.get("records", [])
    failed = [r for r in records if r.get("state") == "failed"]
    if failed:
        return min(failed, key=lambda r: r["seq"])
    started = [r for r in records if r.get("state") == "started"]
    return min(started, key=lambda r: r["seq"]) if started else None


def build_report(
    plan: KillPlan,
    phase: PhaseOutcome,
    injection: Injection | None,
    dumps: dict[int, dict],
    notes: list[str] | None = None,
) -> FaultReport:
    """Compare the dumps (ddp's diagnosis), lay every event on one timeline, judge the result."""
    diag = diagnose(dumps, plan.layout.world_size)
    notes = list(notes or [])
    events: list[tuple[float, str]] = []

    def at(t: float, what: str) -> None:
        events.append((t - phase.started, what))

    if injection is not None:
        _injected(plan, injection, at)
    rows = [
        _rank_row(plan, phase, injection, dumps, diag, rank, at)
        for rank in range(plan.layout.world_size)
    ]
    events.sort(key=lambda e: e[0])
    ok, last = _judge(plan, diag, injection, phase, notes)
    return FaultReport(diag, ok, last, rows, events, notes)


def _injected(plan: KillPlan, injection: Injection, at: Callable[[float, str], None]) -> None:
    at(injection.trigger_time, injection.trigger)
    took = f"the Docker call took {injection.end - injection.start:.3f} s"
    detail = f"{injection.detail}; {took}" if injection.detail else took
    # Stamped when lab issued the call: the fault takes effect somewhere before it returns
    # (docker kill returns once the container is gone, its peers may have noticed first).
    at(
        injection.start,
        f"FAULT: rank {plan.rank} (node{injection.node}) {plan.fault.ROLE} ({detail})",
    )


def _rank_row(
    plan: KillPlan,
    phase: PhaseOutcome,
    injection: Injection | None,
    dumps: dict[int, dict],
    diag: Diagnosis,
    rank: int,
    at: Callable[[float, str], None],
) -> RankRow:
    """One rank's row; its events (entered, gave up, failure record, exit) go to ``at``."""
    rec = _stuck_record(dumps[rank]) if rank in dumps else None
    waited = noticed = None
    saw = ""
    if rec is not None and rec.get("seq") == diag.stuck_seq:
        at(rec["start"], f"rank {rank} entered {_describe(rec)}")
    if rec is not None and rec.get("state") == "failed" and rec.get("end") is not None:
        waited = max(0.0, rec["end"] - rec["start"])
        noticed = rec["end"] - injection.start if injection is not None else None
        saw = error_meaning(rec.get("error"))
        at(
            rec["end"],
            f"rank {rank} gave up on {_describe(rec)} after {fmt_s(waited)}"
            + (f": {saw}" if saw else ""),
        )
    failure = phase.failures.get(rank)
    if failure is not None:
        t, record = failure
        named = ",".join(map(str, record.missing_ranks)) or "none"
        at(t, f"rank {rank} wrote its failure record (missing ranks: {named})")
    if rank in phase.exits:
        at(phase.exits[rank].t, f"rank {rank} exited with code {phase.exits[rank].code}")
    return RankRow(
        rank,
        plan.layout.node_of(rank),
        f"{plan.fault.ROLE} by lab" if rank == plan.rank else "survivor",
        phase.exits[rank].code if rank in phase.exits else None,
        _describe(rec) if rec else None,
        waited,
        noticed,
        saw,
        rec.get("error") if rec else None,
        failure[1].missing_ranks if failure is not None else None,
    )


def _judge(
    plan: KillPlan,
    diag: Diagnosis,
    injection: Injection | None,
    phase: PhaseOutcome,
    notes: list[str],
) -> tuple[bool, str]:
    """The closing line, and whether the diagnosis names the rank lab actually hit."""
    if injection is None:
        return False, f"no diagnosis: the fault was never injected into rank {plan.rank}"
    if diag.stuck_seq is None:
        return (
            False,
            f"no diagnosis: no rank left a record of a stuck collective ({diag.summary()})",
        )
    codes = phase.codes
    quiet = [r for r in plan.survivors if codes.get(r) != PEER_FAILURE_EXIT]
    if quiet:
        notes.append(
            f"ranks {quiet} did not exit with ddp's peer-failure code {PEER_FAILURE_EXIT} "
            f"(exit codes: {codes})"
        )
    unreported = [r for r in plan.survivors if r not in phase.failures]
    if unreported and not quiet:
        notes.append(f"ranks {unreported} exited without a failure record")
    if diag.step is not None and diag.step != plan.at_step:
        when = "late" if diag.step > plan.at_step else "early"
        notes.append(
            f"the fault was aimed at step {plan.at_step} but the stuck collective is in step "
            f"{diag.step}: the injection landed {when} (raise --step-delay-ms on a busy host)"
        )
    if plan.fault.TARGET_NOTICES:
        # A partition: the cut-off rank is alive and arrives like everyone else, so the dumps
        # show a collective every rank entered and none finished. Only lab knows whose link
        # it cut.
        ok = not [r for r in diag.missing_ranks if r != plan.rank]
        where = f"step {diag.step}" if diag.step is not None and diag.step >= 0 else "setup"
        what = (
            f"{diag.op or 'collective'}"
            + (f" of bucket {diag.bucket}" if diag.bucket is not None else "")
            + f", seq {diag.stuck_seq}"
        )
        seen = (
            "every rank arrived, none completed"
            if not diag.missing_ranks
            else f"missing per the dumps: {diag.missing_ranks}"
        )
        return (
            ok,
            f"diagnosis: rank {plan.rank} {plan.fault.ROLE} from the network at {where} "
            f"({what}): {seen}{_noticed(diag)}",
        )
    ok = diag.missing_ranks == [plan.rank]
    line = f"diagnosis: {diag.summary()}"
    if not ok:
        line += f" (but lab {plan.fault.ROLE} rank {plan.rank})"
    return ok, line


def _noticed(diag: Diagnosis) -> str:
    if not diag.noticed:
        return ""
    times = sorted(diag.noticed.values())
    lo, hi = fmt_s(times[0])[:-2], fmt_s(times[-1])[:-2]
    ranks = ",".join(str(r) for r in sorted(diag.noticed))
    word = "rank" if len(diag.noticed) == 1 else "ranks"
    return f"; {word} {ranks} noticed after {lo if lo == hi else f'{lo}-{hi}'} s"


@dataclass
class RestartSummary:
    """The fault report and, with ``--recover``, the recovery check; and the run they came
    from."""

    result: KillResult
    report: FaultReport
    recovery: Recovery | None

    @property
    def ok(self) -> bool:
        """The diagnosis names the rank that was hit (and the recovery is bitwise identical)."""
        return self.report.ok and (self.recovery is None or self.recovery.ok)


def analyse(result: KillResult) -> RestartSummary:
    plan = result.plan
    report = build_report(
        plan, result.phases["fault"], result.injection, result.dumps, result.notes
    )
    recovery = None
    if plan.recover:
        recovery = compare_runs(
            result.logs.get("reference", {}),
            result.logs.get("resume", {}),
            plan.layout.world_size,
        )
    return RestartSummary(result, report, recovery)
