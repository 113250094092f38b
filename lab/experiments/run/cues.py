"""``lab run``'s faults, fired on their cue and lifted on theirs, all undone on the way out.

A context manager over the run: node faults are :mod:`lab.faults`' (prepared when the job
starts, so the injection is one quick call; released whatever happens); a kill SIGKILLs the
rank's worker process (found by its ``RANK``, :mod:`.workers`), not its container, so torchrun's
agent sees its worker die; a link cue replaces the verified link with the new one, probed
again (:func:`lab.shaping.verified_link.verified_link`): measured and shown, not judged, since
the probe's echoes then queue behind the job's own traffic. Step cues are matched against the
step records (rank R's record of step N - 1 for ``kill:rank=R``, rank 0's for the others), time
cues against the wall clock from the job's start.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from lab.engine.cluster import Cluster
from lab.engine.events import Event, RecordEvent
from lab.engine.specs import job_dir
from lab.experiments.run.faults import FaultCue
from lab.experiments.run.names import JOB
from lab.experiments.run.plan import RunPlan
from lab.experiments.run.records import step_of
from lab.experiments.run.result import FaultEvent, RunResult
from lab.experiments.run.workers import Workers
from lab.faults.partition import Partition
from lab.faults.pause import Pause
from lab.shaping.verified_link import verified_link

__all__ = ["Cues", "due"]

_SNAPSHOT_AFTER_S = 0.3  # from a kill to asking the others for their flight recorders
_LINK_SETTLE_S = 15.0  # the probe re-verifies a changed link: no hang verdict meanwhile


def due(cue: FaultCue, event: Event | None, now: float, started: float | None) -> bool:
    """Has ``cue``'s moment come? Pure: a step cue by the record ``event`` carries, a time cue
    by the wall clock ``now`` against the job's start."""
    if cue.at_s is not None:
        return started is not None and now - started >= cue.at_s
    if not isinstance(event, RecordEvent):
        return False
    seen = step_of(event.record, event.t)
    if seen is None:
        return False
    who = cue.rank if cue.kind == "kill" else 0
    assert cue.at_step is not None
    return seen.rank == who and seen.step >= cue.at_step - 1


class Cues:
    def __init__(self, cluster: Cluster, plan: RunPlan, result: RunResult, echo: Callable) -> None:
        self.cluster, self.plan, self.result, self.echo = cluster, plan, result, echo
        self.pending = list(plan.faults)
        self.started: float | None = None
        self.workers = Workers(cluster, plan)
        self._stack = contextlib.ExitStack()
        self._link = contextlib.ExitStack()  # the link now in place
        self._lifts: list[tuple[float, Callable[[], str | None], str]] = []
        self._quiet_until = 0.0

    # --- context ---------------------------------------------------------------------------
    def __enter__(self) -> Cues:
        self._stack.__enter__()
        self._stack.callback(self._link.close)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.__exit__(*exc)

    # --- the link --------------------------------------------------------------------------
    def _set_link(self, ms: float, rate_mbit: float | None, *, judge: bool = True) -> str:
        self._link.close()
        # Mid-run (unjudged) every node is re-shaped at once: the job runs on a bare link
        # between the old shaping's undo and the new one's taking effect.
        kw = {"impair": self.plan.impair, "max_seconds": self.plan.lifetime_s, "judge": judge}
        kw["parallel"] = not judge
        where = f"at {ms:g} ms"
        report = self._link.enter_context(
            verified_link(self.cluster, where, ms, self.plan.shaper, rate_mbit, **kw)
        )
        line = report.line()
        self.result.links.append(line)
        return line

    def link_at_start(self) -> None:
        if self.plan.shaped:
            self.echo(self._set_link(self.plan.ms, self.plan.rate_mbit))

    # --- the run ---------------------------------------------------------------------------
    def start(self, started: float) -> None:
        """The job started (wall clock); node faults are prepared now."""
        self.started = started

    def _at(self) -> float:
        return time.time() - (self.started or time.time())

    def _log(self, text: str) -> None:
        at = self._at()
        self.result.faults.append(FaultEvent(round(at, 3), text))
        self.echo(f"[lab] {at:+.2f} s: {text}")

    def suspends_hang(self, now: float) -> bool:
        """A pause or partition with an end, or a link being re-verified: the steps stop by
        design for a while, which is no hang."""
        return now < self._quiet_until

    def fire(self, event: Event | None, now: float, last_step: dict[int, int]) -> None:
        """Fire every cue that is due; lift every fault whose time is up."""
        kills = any(c.kind == "kill" and c.by_step for c in self.pending)
        if kills and not self.workers.pids and isinstance(event, RecordEvent):
            self.workers.find()  # ahead: the kill itself is then one exec
        for cue in list(self.pending):
            if due(cue, event, now, self.started):
                self.pending.remove(cue)
                self._fire(cue, last_step)
        for lift in list(self._lifts):
            when, undo, text = lift
            if now >= when:
                self._lifts.remove(lift)
                said = undo()
                self._log(text + (f" ({said})" if said else ""))

    def _fire(self, cue: FaultCue, last_step: dict[int, int]) -> None:
        if cue.kind == "kill":
            self._kill(cue, last_step)
        elif cue.kind == "link":
            assert cue.ms is not None
            self._quiet_until = time.time() + _LINK_SETTLE_S
            self._log(f"{cue.describe()}: shaping the new link and probing it")
            rate = cue.rate_mbit or self.plan.rate_mbit
            self._log(self._set_link(cue.ms, rate, judge=False))
        else:
            self._node_fault(cue)

    def _kill(self, cue: FaultCue, last_step: dict[int, int]) -> None:
        assert cue.rank is not None
        found = self.workers.pids if cue.rank in self.workers.pids else self.workers.find()
        if cue.rank not in found:
            self._log(f"{cue.describe()}: no worker with RANK={cue.rank} found, nothing killed")
            return
        node, pid = found[cue.rank]
        code, out = self.cluster.exec(node, ["kill", "-9", str(pid)])
        said = f"exit {code}" + (f": {out.strip()}" if out.strip() else "")
        reached = last_step.get(cue.rank)
        had = f"; it had reported step {reached}" if reached is not None else ""
        self._log(f"{cue.describe()}: SIGKILL of pid {pid} in node{node} ({said}{had})")
        if self.plan.instrument:
            # The survivors' flight recorders now, while they wait for the dead rank: torchrun's
            # agent soon SIGTERMs the dead rank's node-mates, which then leave no dump.
            time.sleep(_SNAPSHOT_AFTER_S)
            self.workers.request_dumps(f"{job_dir(JOB)}/logs")

    def _node_fault(self, cue: FaultCue) -> None:
        assert cue.node is not None
        fault = Pause() if cue.kind == "pause" else Partition()
        fault.prepare(self.cluster, cue.node)
        self._stack.enter_context(fault)  # released on the way out, whatever happens
        fault.inject()
        self._log(f"{cue.describe()}: {fault.detail}")
        if cue.for_s is None:
            return
        self._quiet_until = max(self._quiet_until, time.time() + cue.for_s + _LINK_SETTLE_S)
        lift = _unpause(fault) if isinstance(fault, Pause) else fault.release
        self._lifts.append((time.time() + cue.for_s, lift, f"{cue.kind} of node{cue.node} lifted"))


def _unpause(fault: Pause) -> Callable[[], str | None]:
    def undo() -> str | None:
        fault._paused = False  # lifted here: the release on the way out has nothing to do
        fault._container().unpause()
        return "docker unpause"

    return undo
