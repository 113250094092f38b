"""An elastic restart under torchrun, read back: which worker to kill, what happened when, and
whether the resumed run ended where an uninterrupted one does.

torchrun's agent restarts the whole worker group when one worker dies (``--max-restarts``);
the new workers start with the same command line and ``--auto-resume`` continues from the
newest complete checkpoint. The timeline is built from the job's typed events (records carry
their rank, the host stamps their arrival): the fault, the agent's own report of the failure
(its line, shown as it is and never interpreted), the restarted workers' first record and the
step they resumed after, rank 0's first step and verdict, and every node's exit. The verdict on
recovery compares every rank's final ``params_sha256`` with an uninterrupted run's, bitwise.
Pure: the Docker side only hands over ``ps`` output and events.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ddp.torchfree import ConfigRecord, RankLog, StepRecord, VerdictRecord
from lab.engine.events import Event, ExitEvent, LineEvent, RecordEvent

__all__ = [
    "PS_ARGV",
    "Recovered",
    "compare_final",
    "compare_survivors",
    "restart_timeline",
    "worker_pids",
]

PS_ARGV = ["ps", "-eo", "pid=,args="]  # what worker_pids reads, run in the node
_WORKER = " -u -m ddp train"  # how torchrun starts a worker: sys.executable -u -m ddp train
_AGENT_FAILED = "failed (exitcode"  # torchrun's line when it sees a worker die


def worker_pids(ps_output: str) -> list[int]:
    """The pids of torchrun's workers in ``ps -eo pid=,args=`` output, oldest first (the
    agent's own command line also says ``-m ddp train``, but without ``-u`` before it)."""
    pids = []
    for line in ps_output.splitlines():
        pid, _, args = line.strip().partition(" ")
        if pid.isdigit() and _WORKER in f" {args}" and "torchrun" not in args:
            pids.append(int(pid))
    return sorted(pids)


def restart_timeline(events: Iterable[Event], fault_t: float, fault: str) -> list[str]:
    """Lines ``+S.SS s  what`` (seconds from the fault) for the events of a restarted job."""
    moments: list[tuple[float, str]] = [(fault_t, f"fault: {fault}")]
    agent = resumed = first_step = None
    for e in events:
        if e.t < fault_t:
            continue
        if isinstance(e, LineEvent) and agent is None and _AGENT_FAILED in e.text:
            agent = e
            moments.append((e.t, f"node{e.node} agent: {e.text.split('] ', 1)[-1]}"))
        elif isinstance(e, RecordEvent) and isinstance(e.record, ConfigRecord) and not resumed:
            resumed = e
            moments.append(
                (
                    e.t,
                    f"workers restarted: rank {e.record.rank} (node{e.node}) set up, "
                    f"resuming after step {e.record.start_step}",
                )
            )
        elif isinstance(e, RecordEvent) and e.record.rank == 0:
            if isinstance(e.record, StepRecord) and resumed and first_step is None:
                first_step = e
                moments.append((e.t, f"rank 0 (node{e.node}) trains step {e.record.step}"))
            elif isinstance(e.record, VerdictRecord):
                moments.append((e.t, f"verdict: {e.record.message}"))
        elif isinstance(e, ExitEvent):
            moments.append((e.t, f"node{e.node}: torchrun exited {e.code}"))
    if resumed is None:
        moments.append((fault_t, "no worker restarted after the fault"))
    return [f"{t - fault_t:+8.2f} s  {what}" for t, what in sorted(moments, key=lambda m: m[0])]


@dataclass(frozen=True)
class Recovered:
    """Did the restarted run end bitwise where the uninterrupted one did?"""

    ok: bool
    line: str
    resumed_after: int | None  # the checkpoint step the last attempt started from
    bitwise: bool = True  # compared bitwise with the uninterrupted run (not after a lost host)


def compare_final(reference: Mapping[int, RankLog], resumed: Mapping[int, RankLog]) -> Recovered:
    """Every rank's final ``params_sha256`` and parity, resumed vs uninterrupted. Replicas are
    identical, so a rank that torchrun placed elsewhere after the restart still compares."""
    problems = []
    for name, logs in (("uninterrupted", reference), ("resumed", resumed)):
        for rank in sorted(set(reference) | set(resumed)):
            end = logs[rank].end if rank in logs else None
            if end is None:
                problems.append(f"the {name} run has no end record for rank {rank}")
            elif not end.parity:
                problems.append(f"the {name} run ended with parity broken (rank {rank})")
    starts = {log.config.start_step for log in resumed.values() if log.config is not None}
    after = starts.pop() if len(starts) == 1 else None
    if problems or not reference:
        why = "; ".join(problems) or "no ranks logged"
        return Recovered(False, f"recovered: cannot compare: {why}", after)
    sha = {r: (reference[r].end, resumed[r].end) for r in reference}
    differ = [r for r, (a, b) in sorted(sha.items()) if a.params_sha256 != b.params_sha256]
    if differ:
        return Recovered(
            False,
            f"recovered but final parameters DIFFER from an uninterrupted run on ranks "
            f"{','.join(map(str, differ))}",
            after,
        )
    digest = sha[min(sha)][0].params_sha256[:12]
    return Recovered(
        True,
        f"recovered: final parameters of all {len(reference)} ranks bitwise identical to an "
        f"uninterrupted run (sha256 {digest}..., resumed after step {after})",
        after,
    )


def compare_survivors(resumed: Mapping[int, RankLog], world: int) -> Recovered:
    """A host lost under torchrun: the new, smaller world started fresh, so it is judged on
    its own, not bitwise against the uninterrupted world (its gradients are averaged over
    other shards, in another order): every rank ended with parity and identical replicas."""
    ends = {r: resumed[r].end if r in resumed else None for r in range(world)}
    missing = [r for r, end in ends.items() if end is None]
    broken = [r for r, end in ends.items() if end is not None and not end.parity]
    if missing or broken:
        why = f"no end record for ranks {missing}" if missing else f"parity broken on {broken}"
        return Recovered(False, f"survived: NO, the new world of {world}: {why}", 0, False)
    shas = {end.params_sha256 for end in ends.values() if end is not None}
    if len(shas) != 1:
        return Recovered(False, f"survived: NO, the {world} replicas differ at the end", 0, False)
    return Recovered(
        True,
        f"survived: the {world} ranks left trained a new world from step 0 to the end, parity "
        f"holds and the replicas are identical (sha256 {shas.pop()[:12]}...)",
        0,
        False,
    )
