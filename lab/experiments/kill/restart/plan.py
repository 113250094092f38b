"""``lab kill``'s plan: which rank, when, how, the phases' training configs and their bounds.

Pure and validated before any container exists. A run has up to three phases, one job each,
each in its own directory on the shared volume (rendezvous file, logs, flight dumps), so
nothing of one phase leaks into the next:

- ``reference`` (only with ``--recover``): an uninterrupted run of the same length and settings;
- ``fault``: the run whose rank ``rank`` is hit during step ``at_step``;
- ``resume`` (only with ``--recover``): every rank restarts from the fault phase's newest
  complete checkpoint, and goes on checkpointing as the uninterrupted run did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ddp.torchfree import ConfigRecord, StepRecord, TrainConfig
from lab.engine.events import Event, RecordEvent
from lab.engine.layout import Layout
from lab.engine.specs import DEFAULT_IMAGE, job_dir
from lab.faults import FAULTS, Fault

__all__ = [
    "DEFAULT_TRAIN",
    "DUMP_GRACE_S",
    "RUN_TIMEOUT_HELP",
    "KillPlan",
    "checkpoint_dir",
    "default_run_timeout",
]

DUMP_GRACE_S = 2.0  # ddp's survivors wait this long for the others' flight dumps
_STARTUP_S = 300.0  # containers import torch and meet at the rendezvous (2 shared cores)
_PER_STEP_S = 5.0  # the mini model's step is ~0.1 s; the rest is slack for a busy host
_SLACK_S = 90.0  # added to every bound derived from another
# The fault lands during a step: the sleep inside every step (before backward) is the time the
# injection has to land before the rank reaches that step's first allreduce.
DEFAULT_TRAIN = TrainConfig(
    steps=12,
    checkpoint_every=2,
    step_delay_ms=250.0,
    collective_timeout_s=30.0,
    checkpoint_dir=f"{job_dir('fault')}/logs/checkpoints",
)


def checkpoint_dir(phase: str) -> str:
    """Where ``phase`` writes checkpoints; the resumed run reads (and extends) the fault
    phase's, the only ones written before the fault."""
    return f"{job_dir('fault' if phase == 'resume' else phase)}/logs/checkpoints"


def default_run_timeout(train: TrainConfig) -> float:
    """Bound on an undisturbed phase (see :data:`RUN_TIMEOUT_HELP`)."""
    return _STARTUP_S + train.steps * (train.step_delay_ms / 1e3 + _PER_STEP_S) + _SLACK_S


RUN_TIMEOUT_HELP = (
    f"{_STARTUP_S:g} s start-up + steps x (step delay + {_PER_STEP_S:g} s) + {_SLACK_S:g} s, "
    f"i.e. {default_run_timeout(DEFAULT_TRAIN):g} s for {DEFAULT_TRAIN.steps} steps of "
    f"{DEFAULT_TRAIN.step_delay_ms:g} ms"
)


@dataclass(frozen=True)
class KillPlan:
    """One ``lab kill`` run. ``run_timeout_s`` None: derived from the training settings."""

    rank: int
    at_step: int
    mode: str
    train: TrainConfig = field(default_factory=lambda: DEFAULT_TRAIN)
    nodes: int = 4
    recover: bool = False
    run_timeout_s: float | None = None
    image: str = DEFAULT_IMAGE
    runs_dir: Path = Path("runs")
    progress: bool = True
    phases: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        if self.mode not in FAULTS:
            raise ValueError(f"--mode must be one of {', '.join(FAULTS)}, got {self.mode!r}")
        if self.nodes < 2:  # a fault needs at least one survivor to notice it
            raise ValueError(f"--nodes must be >= 2 (one to hit, one to notice), got {self.nodes}")
        if not 0 <= self.rank < self.nodes:
            raise ValueError(
                f"--rank {self.rank} is out of range: {self.nodes} nodes run ranks "
                f"0..{self.nodes - 1} (one rank per node)"
            )
        steps = self.train.steps
        if not 1 <= self.at_step <= steps:
            raise ValueError(
                f"--at-step {self.at_step} is outside the run: it trains steps 1..{steps}; "
                "pick one of them or raise --steps"
            )
        self.train.local_batch(self.nodes)  # the batch must split evenly over the ranks
        every = self.train.checkpoint_every
        if self.recover and every == 0:
            raise ValueError(
                "--recover needs checkpoints to resume from: pass --checkpoint-every K "
                f"with K < --at-step ({self.at_step})"
            )
        if self.recover and self.at_step <= every:
            raise ValueError(
                f"--recover: no checkpoint exists before the fault (the first is written after "
                f"step {every}, the fault lands in step {self.at_step}); use "
                f"--checkpoint-every < {self.at_step} or a later --at-step"
            )
        if self.run_timeout_s is None:
            object.__setattr__(self, "run_timeout_s", default_run_timeout(self.train))
        elif not (math.isfinite(self.run_timeout_s) and self.run_timeout_s > 0):
            raise ValueError(f"--run-timeout must be > 0 seconds, got {self.run_timeout_s!r}")
        phases = ("reference", "fault", "resume") if self.recover else ("fault",)
        object.__setattr__(self, "phases", phases)

    @property
    def fault(self) -> type[Fault]:
        return FAULTS[self.mode]

    @property
    def layout(self) -> Layout:
        return Layout(self.nodes, 1)  # one rank per node: a fault hits exactly one rank

    @property
    def node(self) -> int:
        return self.layout.node_of(self.rank)

    @property
    def survivors(self) -> list[int]:
        """Ranks expected to notice the fault and exit on their own."""
        everyone = range(self.layout.world_size)
        return [r for r in everyone if r != self.rank or self.fault.TARGET_NOTICES]

    @property
    def notice_timeout_s(self) -> float:
        """How long after the injection the survivors may take to exit with a diagnosis: the
        collective timeout, ddp's grace for the others' dumps, and slack for a busy host."""
        return self.train.collective_timeout_s + DUMP_GRACE_S + _SLACK_S

    @property
    def fault_job_timeout_s(self) -> float:
        """The fault phase's bound inside the nodes: up to the injection, then the notice."""
        assert self.run_timeout_s is not None
        return self.run_timeout_s + self.notice_timeout_s

    @property
    def lifetime_s(self) -> float:
        """The containers' main process outlives every phase, and no longer: a lab that died
        without cleaning up leaves nothing running for good."""
        assert self.run_timeout_s is not None
        total = self.fault_job_timeout_s + (2 * self.run_timeout_s if self.recover else 0)
        return math.ceil(total + 180.0)

    def triggers(self, event: Event) -> bool:
        """Whether ``event`` is the moment to inject: the target rank's record of step
        ``at_step - 1``, or its set-up record when the fault is aimed at step 1. Records, not
        the wording of ddp's lines, so rewording a line cannot stop the injection."""
        if not isinstance(event, RecordEvent) or event.rank != self.rank:
            return False
        if self.at_step == 1:
            return isinstance(event.record, ConfigRecord)
        return isinstance(event.record, StepRecord) and event.record.step == self.at_step - 1

    def config(self, phase: str) -> TrainConfig:
        """The training config of ``phase``: the same settings in every phase, only where
        checkpoints go and whether to resume differ."""
        if phase not in self.phases:
            raise ValueError(f"phase must be one of {', '.join(self.phases)}, got {phase!r}")
        changes: dict = {"checkpoint_dir": None, "resume": phase == "resume"}
        if self.train.checkpoint_every or phase == "resume":
            changes["checkpoint_dir"] = checkpoint_dir(phase)
        return self.train.replace(**changes)

    def describe(self) -> str:
        t = self.train
        return (
            f"{self.layout.describe()}, model {t.model}, {t.steps} steps ({t.step_delay_ms:g} ms "
            f"step delay), collective timeout {t.collective_timeout_s:g} s, checkpoint every "
            f"{t.checkpoint_every or 'never'}; fault: {self.mode} rank {self.rank} in step "
            f"{self.at_step}{', then recover' if self.recover else ''}"
        )
