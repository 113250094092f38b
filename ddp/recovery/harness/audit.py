"""Judging one trial of the fault campaign from the typed records its processes wrote: was
every step committed once, did every member that committed a step hold the same weights after
it, did the replicas end identical with parity judged, and did every process end as the fault
allows. Pure and torch-free, so each rule is tested on synthetic records.

A process is one ``python -m ddp train`` of the trial (``"2"``: rank 2 as started; ``"2+"``:
its replacement). The rules:

* **Committed once.** Each process's own history is a chain (``ddp.recovery.committed``, the
  one judge the demo's and torchft's verdicts use too): a committed step is the one after
  the last step it committed or received by a heal; a heal never goes back. Whoever healed
  to step X from rank F in quorum Q, F entered Q at step X. Two quorums may commit the same
  step only if the earlier one's committers stopped there (died, or were healed over before
  their next commit): otherwise two lineages went on from it. With the run survived, every
  process that finished is at the last step.
* **No split brain.** One parameter digest (``CommitRecord.params_sha256``) per committed step
  across every process that committed it.
* **Identical at the end, parity judged.** Every process that finished wrote the same final
  digest, and a verdict that holds; at least one verdict judged parity on some steps.
* **Exits.** A process the fault killed died of SIGKILL. The run survived: every other process
  exited 0. The run stopped (by design: too few left, the job's etcd lost): every other
  process exited with the same code of ``stop_codes``, wrote its one-line diagnosis as a
  failure record, and no verdict says "holds".
* **A decider lost is replaced.** When the fault took the decider, a member wrote that it took
  the role (``DeciderRecord``) after the fault: every rank training on alone proves nothing,
  since without a decider the next fault would go unanswered.
"""

from __future__ import annotations

import signal
from collections import defaultdict
from dataclasses import dataclass, field

from ddp.program.records import EndRecord, FailureRecord, Record
from ddp.recovery.committed import Chain
from ddp.recovery.records import (
    CommitRecord,
    DeciderRecord,
    HealRecord,
    QuorumRecord,
    RecoveryVerdictRecord,
)

__all__ = [
    "Expect",
    "Judgement",
    "Process",
    "commit_problems",
    "digest_problems",
    "end_problems",
    "exit_problems",
    "judge_trial",
    "recovery_times",
]


@dataclass
class Process:
    """One process of a trial as the campaign saw it end."""

    name: str
    rank: int
    records: list[Record]
    exit_code: int | None  # None: still running when the trial ended (it was killed then)
    killed: bool = False  # the fault was to kill it
    exit_t: float | None = None  # wall clock its end was seen


@dataclass(frozen=True)
class Expect:
    """What the trial's fault allows. ``outcome``: ``survive`` (training goes on to the last
    step), ``stop`` (a clean stop with one of ``stop_codes``), or ``either`` (survived if a
    quorum formed after the fault, else judged as a stop); ``t_fault``: its wall clock."""

    outcome: str
    steps: int
    t_fault: float
    stop_codes: frozenset[int] = frozenset({3})
    decider_lost: bool = False  # the fault took the decider: a member must take the role

    def __post_init__(self) -> None:
        if self.outcome not in ("survive", "stop", "either"):
            raise ValueError(f"outcome must be survive, stop or either, got {self.outcome!r}")


@dataclass
class Judgement:
    """The problems found (none: clean), how the run ended, and the recovery figures in
    seconds after the fault (None: did not happen)."""

    problems: list[str] = field(default_factory=list)
    outcome: str = ""  # "survived" or "stopped"
    quorum_s: float | None = None  # to the first quorum formed after the fault
    commit_s: float | None = None  # to the first step committed in such a quorum
    stop_s: float | None = None  # to the end of the last process that stopped
    role_s: float | None = None  # to a member holding the decider role (a decider lost)

    @property
    def clean(self) -> bool:
        return not self.problems


def _some(items: list) -> str:
    shown = ", ".join(map(str, items[:6]))
    return shown + (" ..." if len(items) > 6 else "")


def _committed(p: Process) -> list[CommitRecord]:
    return [r for r in p.records if isinstance(r, CommitRecord) and r.committed]


def commit_problems(procs: list[Process], steps: int, finished: list[str]) -> list[str]:
    """The committed-once rules (see the module); ``finished``: the processes that must end
    at step ``steps``."""
    problems: list[str] = []
    entered: dict[tuple[str, int], int] = {}  # (process, quorum) -> its step on entering
    final: dict[str, int] = {}
    heals: list[tuple[Process, HealRecord]] = []
    for p in procs:
        chain = Chain()
        for r in p.records:
            if isinstance(r, CommitRecord) and r.committed:
                chain.commit(r.step)
            elif isinstance(r, HealRecord):
                chain.heal(r.step)
                heals.append((p, r))
            elif isinstance(r, QuorumRecord):
                entered[(p.name, r.quorum_id)] = chain.final
        final[p.name] = chain.final
        if chain.again:
            problems.append(f"rank {p.name} committed steps {_some(chain.again)} twice")
        if chain.skipped:
            problems.append(f"rank {p.name} skipped steps {_some(chain.skipped)}")
        if chain.back:
            problems.append(f"rank {p.name} was healed back from step {_some(chain.back)}")
    for p, h in heals:
        sources = [s for s in procs if s.rank == h.from_rank]
        at = [entered[(s.name, h.quorum_id)] for s in sources if (s.name, h.quorum_id) in entered]
        # A source killed right after sending never wrote its quorum record: its last step.
        seen = at or [final[s.name] for s in sources if final[s.name] >= h.step]
        if h.step not in seen:
            problems.append(
                f"rank {p.name} was healed to step {h.step} in quorum {h.quorum_id} from rank "
                f"{h.from_rank}, which was at step {_some(sorted(set(seen))) or 'none'}"
            )
    problems += _twice_across(procs)
    for name in finished:
        if final.get(name, 0) != steps:
            problems.append(f"rank {name} ended at step {final.get(name, 0)} of {steps}")
    return problems


def _twice_across(procs: list[Process]) -> list[str]:
    """A step committed in two quorums where the earlier one's committers went on from it."""
    quorums: dict[int, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    went_on: dict[tuple[str, int], bool] = {}  # (process, step): it committed again before a heal
    for p in procs:
        open_steps: list[int] = []
        for r in p.records:
            if isinstance(r, CommitRecord) and r.committed:
                for s in open_steps:
                    went_on[(p.name, s)] = True
                open_steps = [r.step]
                quorums[r.step][r.quorum_id].append(p.name)
            elif isinstance(r, HealRecord):
                open_steps = []
    problems = []
    for step, by_q in sorted(quorums.items()):
        ids = sorted(by_q)
        for q in ids[:-1]:
            on = [n for n in by_q[q] if went_on.get((n, step))]
            if on:
                later = ", ".join(f"quorum {x} (ranks {_some(by_q[x])})" for x in ids if x > q)
                problems.append(
                    f"step {step} committed twice: in quorum {q} by ranks {_some(on)}, who went "
                    f"on from it, and in {later}"
                )
    return problems


def digest_problems(procs: list[Process]) -> list[str]:
    """One parameter digest per committed step across every process that committed it."""
    by_step: dict[int, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    commits = 0
    for p in procs:
        for r in _committed(p):
            commits += 1
            if r.params_sha256:
                by_step[r.step][r.params_sha256].append(p.name)
    if commits and not by_step:
        return ["the commit records carry no parameter digest: split brain cannot be judged"]
    problems = []
    for step, digests in sorted(by_step.items()):
        if len(digests) > 1:
            each = "; ".join(f"{d[:8]} on ranks {_some(n)}" for d, n in digests.items())
            problems.append(
                f"split brain at step {step}: {len(digests)} parameter digests ({each})"
            )
    return problems


def end_problems(procs: list[Process], finished: list[str]) -> list[str]:
    """Every finished process ended with the same parameters and a verdict that holds, and
    parity against the single process was judged."""
    by_name = {p.name: p for p in procs}
    problems, digests, judged = [], defaultdict(list), 0
    for name in finished:
        records = by_name[name].records
        ends = [r for r in records if isinstance(r, EndRecord)]
        verdicts = [r for r in records if isinstance(r, RecoveryVerdictRecord)]
        if not ends or not verdicts:
            problems.append(f"rank {name} wrote no {'end' if not ends else 'verdict'} record")
        for e in ends[-1:]:
            digests[e.params_sha256].append(name)
        for v in verdicts[-1:]:
            judged = max(judged, v.judged_steps)
            if not v.holds:
                problems.append(f"rank {name}'s verdict: {v.message}")
    if len(digests) > 1:
        each = "; ".join(f"{d[:8]} on ranks {_some(n)}" for d, n in digests.items())
        problems.append(f"replicas differ at the end: {each}")
    if finished and not judged:
        problems.append("parity against the single process was never judged")
    return problems


def _died_of_kill(code: int | None) -> bool:
    return code == -signal.SIGKILL


def exit_problems(procs: list[Process], outcome: str, stop_codes: frozenset[int]) -> list[str]:
    """How each process ended, for a run that ``survived`` or ``stopped``."""
    problems = []
    for p in procs:
        if p.killed and not _died_of_kill(p.exit_code):
            problems.append(f"rank {p.name} was to die of the fault but exited {p.exit_code}")
    rest = [p for p in procs if not p.killed]
    for p in rest:
        if p.exit_code is None:
            problems.append(f"rank {p.name} was still running at the end")
    if outcome == "survived":
        for p in rest:
            if p.exit_code not in (0, None):
                fail = next((r for r in p.records if isinstance(r, FailureRecord)), None)
                said = f": {fail.message}" if fail else ""
                problems.append(f"rank {p.name} exited {p.exit_code}{said}")
        return problems
    holds = [
        p.name
        for p in rest
        if any(isinstance(r, RecoveryVerdictRecord) and r.holds for r in p.records)
    ]
    if holds:
        problems.append(
            f"no quorum formed after the fault, yet ranks {_some(holds)} said the run holds"
        )
    codes = {p.exit_code for p in rest if p.exit_code is not None}
    if len(codes) > 1 or not codes <= stop_codes:
        each = ", ".join(f"rank {p.name} {p.exit_code}" for p in rest)
        want = " or ".join(map(str, sorted(stop_codes)))
        problems.append(f"a clean stop exits {want} on every rank: {each}")
    silent, long = [], []
    for p in rest:
        fails = [r.message.strip() for r in p.records if isinstance(r, FailureRecord)]
        if not fails:
            silent.append(p.name)
        elif not fails[-1] or "\n" in fails[-1]:
            long.append(p.name)
    if silent:
        problems.append(f"ranks {_some(silent)} stopped without a failure record (the one line)")
    if long:
        problems.append(f"ranks {_some(long)} stopped with a diagnosis that is not one line")
    return problems


def recovery_times(records: list[Record], t_fault: float) -> tuple[float | None, float | None]:
    """Seconds from the fault to the first quorum formed after it, and to the first step
    committed in such a quorum (a step the old quorum still committed after the fault does
    not count: it is not a recovery)."""
    before = [r.quorum_id for r in records if isinstance(r, QuorumRecord) and r.t <= t_fault]
    q_at = max(before, default=0)
    quorums = [r.t for r in records if isinstance(r, QuorumRecord) and r.quorum_id > q_at]
    commits = [
        r.t
        for r in records
        if isinstance(r, CommitRecord) and r.committed and r.quorum_id > q_at and r.t >= t_fault
    ]
    # A quorum record's time is when the member learned of it: never before the fault for a
    # quorum formed after it, but clocks of one host can still disagree by a hair.
    q = max(min(quorums) - t_fault, 0.0) if quorums else None
    c = max(min(commits) - t_fault, 0.0) if commits else None
    return q, c


def judge_trial(procs: list[Process], expect: Expect) -> Judgement:
    """All of the rules above for one trial."""
    records = [r for p in procs for r in p.records]
    j = Judgement()
    j.quorum_s, j.commit_s = recovery_times(records, expect.t_fault)
    survived = expect.outcome == "survive" or (
        expect.outcome == "either" and j.quorum_s is not None
    )
    j.outcome = "survived" if survived else "stopped"
    rest = [p.name for p in procs if not p.killed]
    finished = rest if survived else []
    j.problems += commit_problems(procs, expect.steps, finished)
    j.problems += digest_problems(procs)
    if survived:
        j.problems += end_problems(procs, finished)
    else:
        ends = [p.exit_t for p in procs if not p.killed and p.exit_t is not None]
        j.stop_s = max(ends) - expect.t_fault if ends else None
    j.problems += exit_problems(procs, j.outcome, expect.stop_codes)
    if expect.decider_lost:
        took = [r.t for r in records if isinstance(r, DeciderRecord) and r.t >= expect.t_fault]
        if took:
            j.role_s = min(took) - expect.t_fault
        else:
            j.problems.append("no member took the decider role after the decider was lost")
    return j
