"""What ``lab kill --launcher torchrun`` hands to its judge (:mod:`.torchrun_analysis`): the
jobs' exits, lab's kill, the faulted job's typed events, the collected logs. Plain data, so the
verdict is tested from synthetic values as well as from a real run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ddp.torchfree import RankLog
from lab.engine.events import Event
from lab.experiments.kill.torchrun.plan import TorchrunKillPlan

__all__ = ["JobOutcome", "TorchrunKillResult", "WorkerKill"]


@dataclass(frozen=True)
class WorkerKill:
    """Lab's kill of one worker process, or of a whole host's containers (``host``; then
    ``rank`` is the rank whose record triggered it and ``pid`` 0); times are ``time.time()``."""

    rank: int
    node: int
    pid: int  # in the node's pid namespace, from the rank's set-up record
    trigger: str  # what lab saw, e.g. "rank 3 reported step 4 done"
    trigger_time: float
    start: float  # just before the docker exec of kill
    end: float  # when it returned
    code: int  # kill's exit code in the node: 0, the signal was sent
    output: str = ""
    host: str = ""  # --mode host: what went, e.g. "host2 down: docker kill of node2 ..."

    @property
    def what(self) -> str:
        if self.host:
            return self.host
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
