"""The report of a ``lab kill`` run, built from what it collected: pure, so testable without Docker.

Inputs are the fault phase's output lines (as lab received them, with host times), each rank's
exit code, the flight recorder dumps the ranks left on the shared volume and lab's own record
of the injection. Containers share the host's clock, so the dumps' ``time.time()`` stamps and
lab's stamps sit on one timeline.

The diagnosis itself is ddp's (:func:`ddp.diagnosis.diagnose` over the dumps): lab adds what
only it knows, which rank it hit and how, and checks that the diagnosis names that rank.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from ddp.diagnosis import Diagnosis, diagnose
from lab.fault_plan import FaultPlan

__all__ = [
    "FaultReport",
    "Injection",
    "build_report",
    "progress_step",
]

_RANK_PREFIX = re.compile(r"^\[rank(\d+)\] ?")
_GLOO_LOCATION = re.compile(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*")
_STEP_LINE = re.compile(r"^step (\d+)\s+loss\s")
_VERBS = {"kill": "SIGKILLed", "pause": "paused", "partition": "cut off from the network"}


def _strip(text: str) -> str:
    return _RANK_PREFIX.sub("", text, count=1)


def progress_step(rank: int, text: str) -> int | None:
    """The step a rank just finished, if ``text`` (one output line, node prefix removed) says
    so: ``[rank2] step 4  loss ...`` for ranks > 0, a parity table row for rank 0; else None."""
    from ddp.parity import table_row_step

    body = _strip(text)
    if rank == 0:
        return table_row_step(body)
    m = _STEP_LINE.match(body)
    return int(m.group(1)) if m else None


def is_setup_line(text: str) -> bool:
    """ddp's line once the model is wrapped and training is about to start (step 1 follows)."""
    body = _strip(text)
    return " ranks, model " in body and ("buckets" in body or "sync by" in body)


@dataclass
class Injection:
    """Lab's record of the fault: what it did, when (host time.time()), how long it took."""

    mode: str
    rank: int
    node: int
    trigger_time: float  # when lab saw the rank finish step at_step - 1
    start: float  # just before the Docker call
    end: float  # when the Docker call returned: the fault is in place
    detail: str = ""  # e.g. the iptables rules


@dataclass
class RankRow:
    rank: int
    role: str  # "survivor", or what lab did to it
    exit_code: int | None
    waiting_for: str | None  # the collective it was blocked in when it failed / dumped
    waited_s: float | None  # from entering that collective to its failure
    noticed_after_s: float | None  # from the injection to its failure
    error: str | None
    dump_reason: str | None
    diagnosis_line: str | None  # what the rank itself printed


@dataclass
class FaultReport:
    plan: FaultPlan
    diagnosis: Diagnosis
    ok: bool
    last_line: str
    rows: list[RankRow]
    timeline: list[tuple[float, str]]  # (seconds since the phase started, event)
    notes: list[str] = field(default_factory=list)

    def text(self) -> str:
        """The human report: timeline, per-rank table, notes (the last line is printed apart)."""
        out = ["timeline (seconds since the ranks were started):"]
        out += [f"  {t:+8.2f} s  {what}" for t, what in self.timeline]
        out.append(
            f"  {'rank':>4}  {'role':<26} {'blocked in':<40} {'waited':>8} "
            f"{'after fault':>11}  exit"
        )
        for r in self.rows:
            out.append(
                f"  {r.rank:4d}  {r.role:<26} {r.waiting_for or '-':<40} "
                f"{_opt_s(r.waited_s):>8} {_opt_s(r.noticed_after_s):>11}  "
                f"{'-' if r.exit_code is None else r.exit_code}"
            )
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": asdict(self.plan),
            "ok": self.ok,
            "last_line": self.last_line,
            "diagnosis": asdict(self.diagnosis),
            "ranks": [asdict(r) for r in self.rows],
            "timeline": [{"t_s": round(t, 4), "event": e} for t, e in self.timeline],
            "notes": self.notes,
        }


def _short_error(error: str | None) -> str:
    """gloo's first sentence without its source location: "Connection closed by peer [ip]:port"."""
    if not error:
        return ""
    text = _GLOO_LOCATION.sub("", error.strip().splitlines()[0])
    return text.split(". ")[0][:120]


def _opt_s(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.2f} s" if v < 1 else f"{v:.1f} s"


def _describe(rec: dict) -> str:
    what = rec.get("op") or "collective"
    if rec.get("bucket") is not None:
        what += f" of bucket {rec['bucket']}"
    step = rec.get("step")
    where = f"step {step}" if isinstance(step, int) and step >= 0 else "setup"
    return f"{what}, seq {rec['seq']}, {where}"


def _blocked_record(dump: dict) -> dict | None:
    """The collective a rank was stuck in: its failed one, else its oldest unfinished one."""
    records = dump.get("records", [])
    failed = [r for r in records if r.get("state") == "failed"]
    if failed:
        return min(failed, key=lambda r: r["seq"])
    started = [r for r in records if r.get("state") == "started"]
    return min(started, key=lambda r: r["seq"]) if started else None


def build_report(
    plan: FaultPlan,
    phase_start: float,
    injection: Injection | None,
    lines: list[tuple[float, int | None, str]],
    exits: dict[int, int],
    dumps: dict[int, dict],
) -> FaultReport:
    """Compare the dumps (ddp's diagnosis), lay every event on one timeline, judge the result.

    ``lines`` are ``(host time, rank or None, text)`` as received from the containers;
    ``exits`` maps rank to exit code (137 for a SIGKILLed container).
    """
    diag = diagnose(dumps, plan.world_size)
    notes: list[str] = []
    events: list[tuple[float, str]] = []

    def at(t: float, what: str) -> None:
        events.append((t - phase_start, what))

    diagnosis_lines: dict[int, tuple[float, str]] = {}
    for t, rank, text in lines:
        if rank is not None and "diagnosis:" in text and rank not in diagnosis_lines:
            diagnosis_lines[rank] = (t, _strip(text))
    if injection is not None:
        prev = plan.at_step - 1
        at(
            injection.trigger_time,
            f"rank {plan.rank} reported step {prev} done"
            if prev
            else f"rank {plan.rank} set up, about to start step 1",
        )
        at(
            injection.end,
            f"FAULT: rank {plan.rank} (node{injection.node}) {_VERBS[plan.mode]} "
            f"(the Docker call took {injection.end - injection.start:.3f} s)"
            + (f": {injection.detail}" if injection.detail else ""),
        )
    rows = []
    for rank in range(plan.world_size):
        dump = dumps.get(rank)
        rec = _blocked_record(dump) if dump else None
        hit = rank == plan.rank
        role = "survivor"
        if hit:
            role = {"kill": "SIGKILLed (fault)", "pause": "paused (fault)",
                    "partition": "cut off (fault)"}[plan.mode]  # fmt: skip
        waited = noticed = None
        if rec is not None:
            if rec.get("seq") == diag.stuck_seq:
                at(rec["start"], f"rank {rank} entered {_describe(rec)}")
            if rec.get("end") is not None and rec.get("state") == "failed":
                waited = max(0.0, rec["end"] - rec["start"])
                if injection is not None:
                    noticed = rec["end"] - injection.end
                error = _short_error(rec.get("error"))
                at(
                    rec["end"],
                    f"rank {rank} noticed: {_describe(rec)} failed after "
                    f"{_opt_s(waited)}" + (f" ({error})" if error else ""),
                )
        if rank in diagnosis_lines:
            at(diagnosis_lines[rank][0], f"rank {rank} printed its diagnosis")
        if rank in exits:
            exit_time = next((t for t, r, x in lines if r == rank and x.startswith("exit ")), None)
            if exit_time is not None:
                at(exit_time, f"rank {rank} exited with code {exits[rank]}")
        rows.append(
            RankRow(
                rank=rank,
                role=role,
                exit_code=exits.get(rank),
                waiting_for=_describe(rec) if rec else None,
                waited_s=waited,
                noticed_after_s=noticed,
                error=rec.get("error") if rec else None,
                dump_reason=dump.get("reason") if dump else None,
                diagnosis_line=diagnosis_lines.get(rank, (0.0, None))[1],
            )
        )
    events.sort(key=lambda e: e[0])

    ok, last = _judge(plan, diag, injection, exits, notes)
    return FaultReport(plan, diag, ok, last, rows, events, notes)


def _judge(
    plan: FaultPlan,
    diag: Diagnosis,
    injection: Injection | None,
    exits: dict[int, int],
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
    quiet = [r for r in plan.survivors if exits.get(r) != 3]
    if quiet:
        notes.append(
            f"ranks {quiet} did not exit with ddp's peer-failure code 3 "
            f"(exit codes: {dict(sorted(exits.items()))})"
        )
    if diag.step is not None and diag.step != plan.at_step:
        notes.append(
            f"the fault was aimed at step {plan.at_step} but the stuck collective is in step "
            f"{diag.step}: the injection landed {'late' if diag.step > plan.at_step else 'early'}"
            " (raise --step-delay-ms on a busy host)"
        )
    if plan.mode == "partition":
        # The cut-off rank is alive and arrives like everyone else; the dumps show a collective
        # every rank entered and none finished. Only lab knows whose link it cut.
        others = [r for r in diag.missing_ranks if r != plan.rank]
        ok = not others
        where = f"step {diag.step}" if diag.step is not None and diag.step >= 0 else "setup"
        what = _what(diag)
        noticed = _noticed(diag)
        head = f"rank {plan.rank} cut off from the network at {where} ({what}): " + (
            "every rank arrived, none completed"
            if not diag.missing_ranks
            else f"missing per the dumps: {diag.missing_ranks}"
        )
        return ok, f"diagnosis: {head}{noticed}"
    ok = diag.missing_ranks == [plan.rank]
    line = f"diagnosis: {diag.summary()}"
    if not ok:
        line += f" (but lab {_VERBS[plan.mode]} rank {plan.rank})"
    return ok, line


def _what(diag: Diagnosis) -> str:
    what = diag.op or "collective"
    if diag.bucket is not None:
        what += f" of bucket {diag.bucket}"
    return f"{what}, seq {diag.stuck_seq}"


def _noticed(diag: Diagnosis) -> str:
    if not diag.noticed:
        return ""
    times = sorted(diag.noticed.values())
    lo, hi = _opt_s(times[0])[:-2], _opt_s(times[-1])[:-2]
    ranks = ",".join(str(r) for r in sorted(diag.noticed))
    word = "rank" if len(diag.noticed) == 1 else "ranks"
    return f"; {word} {ranks} noticed after {lo if lo == hi else f'{lo}-{hi}'} s"
