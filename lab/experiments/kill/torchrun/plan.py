"""``lab kill --launcher torchrun``'s plan: kill one worker process, let torchrun recover.

Pure and validated before any container exists. One torchrun per node (``--nodes`` x
``--procs-per-node`` workers, ``--max-restarts`` restarts of the worker group); two jobs on
the same containers, each with its own directory (logs, checkpoints) on the shared volume:

- ``reference``: an uninterrupted run of the same training config;
- ``fault``: the run in which rank ``rank``'s worker process (not its container: the agent
  must survive to see it) is SIGKILLed when that rank reports step ``at_step - 1``, so the
  kill lands in step ``at_step``. torchrun's agent restarts the worker group with the same
  command line, and ``--auto-resume`` makes the new workers continue from the newest complete
  checkpoint in the job's directory.

``--mode host`` (across ``--hosts``) takes a whole host away instead, every container on it
killed at once (:class:`lab.faults.host.HostDown`), when rank 0 reports step ``at_step - 1``.
The agents run ``--nnodes MIN:MAX`` with MIN the nodes left, so the survivors re-rendezvous as
a smaller world, which starts fresh (``--checkpoint-every 0``): rank 0 alone writes
checkpoints, so they may have gone with the host, and they hold another world's run.

Only what torchrun can recover is offered: ``--mode kill`` and ``host`` (a paused worker is no
failure to the agent, and a worker shares its container's network, so one cannot be cut off
alone), and no ``--recover`` (torchrun restarts the workers itself; that is the experiment).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ddp.torchfree import StepRecord, TrainConfig
from lab.engine.events import Event, RecordEvent
from lab.engine.layout import Layout
from lab.engine.specs import DEFAULT_IMAGE, job_dir
from lab.engine.training import Torchrun
from lab.experiments.kill.restart.plan import DEFAULT_TRAIN, default_run_timeout

__all__ = ["PHASES", "TorchrunKillPlan"]

PHASES = ("reference", "fault")
_MODES = ("kill", "host")
_CONTAINER_SLACK_S = 180.0  # the containers outlive both jobs by this much


@dataclass(frozen=True)
class TorchrunKillPlan:
    """One ``lab kill --launcher torchrun`` run. ``run_timeout_s`` None: derived from the
    training settings (as for ``lab kill``); it bounds the reference job and each attempt of
    the faulted one (before the fault, and after the restart)."""

    rank: int
    at_step: int
    train: TrainConfig = field(default_factory=lambda: DEFAULT_TRAIN)
    nodes: int = 2
    procs_per_node: int = 2
    max_restarts: int = 1
    mode: str = "kill"
    lost: tuple[int, ...] = ()  # --mode host: the nodes on the host taken away
    recover: bool = False
    run_timeout_s: float | None = None
    image: str = DEFAULT_IMAGE
    runs_dir: Path = Path("runs")
    progress: bool = True

    def __post_init__(self) -> None:
        if self.mode not in _MODES:
            raise ValueError(
                f"--launcher torchrun supports --mode kill or host, got --mode {self.mode}: "
                "torchrun restarts workers that die; a paused worker is no failure to its "
                "agent, and a worker shares its container's network, so it cannot be cut off "
                "alone (use --launcher file for pause and partition)"
            )
        if self.recover:
            raise ValueError(
                "--recover does not go with --launcher torchrun: torchrun's agent restarts the "
                "workers itself and they resume from the newest checkpoint; drop --recover"
            )
        if self.max_restarts < 1:
            raise ValueError(
                f"--max-restarts {self.max_restarts}: torchrun would give up at the first "
                "failure; pass --max-restarts 1 or more"
            )
        if self.mode == "host":
            self._check_host()
        self.launch  # noqa: B018 - validates --nodes, --procs-per-node, --max-restarts
        world = self.layout.world_size
        if not 0 <= self.rank < world:
            raise ValueError(
                f"--rank {self.rank} is out of range: {self.nodes} nodes x "
                f"{self.procs_per_node} workers run ranks 0..{world - 1}"
            )
        steps, every = self.train.steps, self.train.checkpoint_every
        if not 1 <= self.at_step <= steps:
            raise ValueError(
                f"--at-step {self.at_step} is outside the run: it trains steps 1..{steps}; "
                "pick one of them or raise --steps"
            )
        if self.mode == "kill" and not 1 <= every < self.at_step:
            raise ValueError(
                f"--launcher torchrun: the restarted workers resume from a checkpoint, and "
                f"none exists before the fault with --checkpoint-every {every} (the fault "
                f"lands in step {self.at_step}); pass 1 <= --checkpoint-every < "
                f"{self.at_step} or a later --at-step"
            )
        self.train.local_batch(world)  # the batch must split evenly over the ranks
        self.config("fault")  # validates the jobs' config before any container exists
        if self.run_timeout_s is None:
            object.__setattr__(self, "run_timeout_s", default_run_timeout(self.train))
        elif not (math.isfinite(self.run_timeout_s) and self.run_timeout_s > 0):
            raise ValueError(f"--run-timeout must be > 0 seconds, got {self.run_timeout_s!r}")

    def _check_host(self) -> None:
        if not 0 < len(self.lost) < self.nodes or not set(self.lost) <= set(range(self.nodes)):
            raise ValueError(
                f"--mode host: the host's nodes {list(self.lost)} must be some, not all, of "
                f"the {self.nodes} nodes; spread them with --hosts (and --placement)"
            )
        if self.at_step < 2 or self.train.checkpoint_every:
            raise ValueError(
                "--launcher torchrun --mode host: the survivors start a new world from step 0 "
                "(rank 0's checkpoints may go with the host, and were of another world) after "
                "rank 0 reports step --at-step - 1: pass --checkpoint-every 0 and --at-step 2 "
                f"or later (got {self.train.checkpoint_every} and {self.at_step})"
            )

    @property
    def launch(self) -> Torchrun:
        """``--mode host``: ``--nnodes MIN:MAX``, MIN the nodes that stay."""
        low = self.nodes - len(self.lost) if self.mode == "host" else None
        return Torchrun(
            self.nodes, self.procs_per_node, max_restarts=self.max_restarts, min_nodes=low
        )

    @property
    def survivors(self) -> int:
        """The ranks after the fault: every rank again, or those of the nodes that stay."""
        return (self.nodes - len(self.lost)) * self.procs_per_node

    @property
    def layout(self) -> Layout:
        """The containers; which rank runs where is torchrun's rendezvous's choice."""
        return Layout(self.nodes, self.procs_per_node)

    @property
    def phases(self) -> tuple[str, ...]:
        return PHASES

    def config(self, phase: str) -> TrainConfig:
        """A job's training config, the same settings in both: logs and checkpoints in the
        job's own directory on the shared volume, and a checkpoint there means resume (what
        a worker restarted with the same command line needs)."""
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {', '.join(PHASES)}, got {phase!r}")
        return self.train.replace(
            log_dir=f"{job_dir(phase)}/logs", checkpoint_dir=None, resume=False, auto_resume=True
        )

    @property
    def reference_timeout_s(self) -> float:
        assert self.run_timeout_s is not None
        return self.run_timeout_s

    @property
    def fault_timeout_s(self) -> float:
        """The faulted job: an attempt up to the fault, and one from the restart on."""
        assert self.run_timeout_s is not None
        return 2 * self.run_timeout_s

    @property
    def lifetime_s(self) -> float:
        """The containers' main process outlives both jobs, and no longer."""
        return math.ceil(self.reference_timeout_s + self.fault_timeout_s + _CONTAINER_SLACK_S)

    def triggers(self, event: Event) -> bool:
        """The moment to kill: rank ``rank``'s record of step ``at_step - 1`` (``at_step`` is
        at least 2: a checkpoint comes first). By ``record.rank``: under torchrun a node's
        stream carries several ranks."""
        record = getattr(event, "record", None)
        return (
            isinstance(event, RecordEvent)
            and isinstance(record, StepRecord)
            and (record.rank, record.step) == (self.rank, self.at_step - 1)
        )

    def describe(self) -> str:
        t = self.train
        if self.mode == "host":
            lost = ", ".join(f"node{n}" for n in self.lost)
            return (
                f"torchrun on {self.layout.describe().replace('rank', 'worker')}, --nnodes "
                f"{self.nodes - len(self.lost)}:{self.nodes}, max restarts {self.max_restarts}, "
                f"model {t.model}, {t.steps} steps ({t.step_delay_ms:g} ms step delay), no "
                f"checkpoint; fault: the host of {lost} goes away in step {self.at_step}"
            )
        return (
            f"torchrun on {self.layout.describe().replace('rank', 'worker')}, max restarts "
            f"{self.max_restarts}, model {t.model}, {t.steps} steps ({t.step_delay_ms:g} ms "
            f"step delay), checkpoint every {t.checkpoint_every}, auto-resume; fault: SIGKILL "
            f"rank {self.rank}'s worker process in step {self.at_step}"
        )
