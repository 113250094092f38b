"""``lab kill --recovery live``'s plan: the job, the fault, the replacement, and the restart
path it is compared with. Pure and validated before any container exists.

The ranks run one per container (nodes 0..N-1) and the coordinator in a container of its own
(node N), so no rank's fault takes it along: under ``--recovery live`` that is the launcher's
decider (``ddp.recovery.etcd.decider``), and the job's etcd runs in three more containers
(nodes N+1..N+3), so that a member's loss is a container's (``--target etcd --count 1|2``);
under torchft, its lighthouse. The restart path is the same job under
``lab kill --recover`` (checkpoints every ``restart_checkpoint_every`` steps, every rank
restarted after the fault, resumed from the newest checkpoint): the row the live path is
measured against, run by the same command on the same containers' image.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from ddp.torchfree import TrainConfig
from lab.engine.layout import Layout
from lab.engine.specs import DEFAULT_IMAGE
from lab.experiments.kill.restart.plan import KillPlan, checkpoint_dir, default_run_timeout

__all__ = [
    "COORDINATOR_LOST",
    "COORDINATOR_PORT",
    "ETCD_MEMBERS",
    "LIVE_MODES",
    "LIVE_TRAIN",
    "RECOVERIES",
    "TARGETS",
    "LivePlan",
]

COORDINATOR_PORT = 29500
# What the fault hits: a rank (--rank), the coordinator's container (--target coordinator), or
# --count of the etcd members' containers (--target etcd).
TARGETS = ("rank", "coordinator", "etcd")
ETCD_MEMBERS = 3  # one lost is survived; two are a majority, and training stops
# ddp's exit code for a rank whose control plane stopped answering (etcd lost its majority):
# it stops rather than train on with nobody to notice the next fault.
COORDINATOR_LOST = 5
LIVE_MODES = ("kill", "pause", "partition")
# The tower model (82 tensors, 1.1 MB): big enough that healing moves real bytes. A short
# sleep per step keeps the steps apart so the fault lands inside the one it is aimed at.
LIVE_TRAIN = TrainConfig(
    model="tower",
    steps=40,
    batch_size=64,
    step_delay_ms=100.0,
    collective_timeout_s=10.0,
    recovery="live",
    heartbeat_timeout_s=2.0,
)
_SLACK_S = 120.0
# ours, or the same job under torchft (its lighthouse where our coordinator runs)
RECOVERIES = ("live", "torchft")


@dataclass(frozen=True)
class LivePlan:
    """One ``lab kill --recovery live`` run."""

    rank: int
    at_step: int
    mode: str
    train: TrainConfig = field(default_factory=lambda: LIVE_TRAIN)
    nodes: int = 4
    rejoin: bool = False
    compare: bool = True  # also run the restart path on the same job
    recovery: str = "live"  # "torchft": torchft's Manager and lighthouse drive the same job
    torchft: bool = False  # (live) also run the same job under torchft, for its row
    restart_checkpoint_every: int = 2
    target: str = "rank"  # one of TARGETS; otherwise rank is the one whose step times it
    count: int = 1  # --target etcd: how many of its members the fault hits
    run_timeout_s: float | None = None
    image: str = DEFAULT_IMAGE
    runs_dir: Path = Path("runs")
    progress: bool = True

    def __post_init__(self) -> None:
        if self.mode not in LIVE_MODES:
            raise ValueError(
                f"--recovery live takes --mode {', '.join(LIVE_MODES)}, got {self.mode!r}"
            )
        if self.nodes < 3:
            raise ValueError(
                f"--recovery live needs --nodes >= 3, got {self.nodes}: after losing one rank "
                "the survivors must be more than half of the quorum to go on"
            )
        if not 0 <= self.rank < self.nodes:
            raise ValueError(f"--rank must be in 0..{self.nodes - 1}, got {self.rank}")
        if not 2 <= self.at_step < self.train.steps:
            raise ValueError(
                f"--at-step must be in 2..{self.train.steps - 1} (a step before the fault to "
                f"measure, one after it to commit), got {self.at_step}"
            )
        if self.recovery not in RECOVERIES:
            raise ValueError(
                f"recovery must be one of {', '.join(RECOVERIES)}, got {self.recovery!r}"
            )
        if self.train.recovery != self.recovery:
            raise ValueError(f"the training config must have recovery={self.recovery!r}")
        if self.target not in TARGETS:
            raise ValueError(f"--target must be one of {', '.join(TARGETS)}, got {self.target!r}")
        if self.target != "rank":
            both = [f for f, on in (("--rejoin", self.rejoin), ("--compare", self.compare)) if on]
            if self.recovery != "live" or self.torchft or both:
                raise ValueError(
                    f"--target {self.target} hits our control plane, which only --recovery "
                    "live has, and replaces no rank and compares with no other path: "
                    f"drop {', '.join(both) or '--compare torchft'}"
                    if self.recovery == "live"
                    else f"--target {self.target} goes with --recovery live"
                )
        if not 1 <= self.count <= (ETCD_MEMBERS if self.target == "etcd" else 1):
            raise ValueError(
                f"--count is how many of the {ETCD_MEMBERS} etcd members --target etcd hits "
                f"(1..{ETCD_MEMBERS}), got {self.count}"
                if self.target == "etcd"
                else f"--count goes with --target etcd (got {self.count})"
            )
        if self.torchft and self.recovery == "torchft":
            raise ValueError("a torchft run compares with torchft itself: drop torchft=True")
        if self.compare and not 1 <= self.restart_checkpoint_every < self.at_step:
            raise ValueError(
                f"the restart path checkpoints every {self.restart_checkpoint_every} steps: "
                f"that must be >= 1 and below --at-step {self.at_step}"
            )
        self.train.local_batch(self.nodes)
        if self.run_timeout_s is None:
            object.__setattr__(self, "run_timeout_s", default_run_timeout(self.train))
        elif not (math.isfinite(self.run_timeout_s) and self.run_timeout_s > 0):
            raise ValueError(f"--run-timeout must be > 0 seconds, got {self.run_timeout_s!r}")
        if self.compare:
            self.restart_plan()  # the restart path's plan validates too

    @property
    def layout(self) -> Layout:
        """The ranks' nodes: one rank each. The coordinator's node and etcd's come after."""
        return Layout(self.nodes, 1)

    @property
    def cluster_layout(self) -> Layout:
        return Layout(self.nodes + 1 + len(self.etcd_nodes), 1)

    @property
    def coordinator_node(self) -> int:
        return self.nodes

    @property
    def etcd_nodes(self) -> tuple[int, ...]:
        """The etcd members' nodes (``--recovery live`` only), after the coordinator's."""
        first = self.coordinator_node + 1
        return tuple(range(first, first + ETCD_MEMBERS)) if self.recovery == "live" else ()

    @property
    def fault_nodes(self) -> tuple[int, ...]:
        """The nodes the fault hits: the rank's (one rank per node), the coordinator's, or the
        first ``count`` etcd members'."""
        if self.target == "etcd":
            return self.etcd_nodes[: self.count]
        return (self.coordinator_node if self.target == "coordinator" else self.rank,)

    @property
    def lost(self) -> int | None:
        """The rank the fault takes away (None: the control plane was hit, not a rank)."""
        return self.rank if self.target == "rank" else None

    @property
    def target_text(self) -> str:
        if self.target == "etcd":
            return f"{self.count} of the {ETCD_MEMBERS} etcd members"
        if self.target == "coordinator":
            return "the launcher's decider"
        return f"rank {self.rank}"

    @property
    def lifetime_s(self) -> float:
        assert self.run_timeout_s is not None
        return math.ceil(2 * self.run_timeout_s + _SLACK_S)

    def config(self, coordinator: str | None) -> TrainConfig:
        """Every rank's config (a replacement's too): torchft's lighthouse at ``HOST:PORT``;
        ours finds etcd in the environment (None)."""
        return self.train.replace(coordinator=coordinator)

    def coordinator_argv(self) -> list[str]:
        """Our decider, or torchft's lighthouse: a quorum needs more than half the ranks
        (half rounded up), so a split is refused as ours refuses it."""
        assert self.run_timeout_s is not None
        if self.recovery == "torchft":
            return [
                "python",
                "-m",
                "ddp.recovery.demo.torchft.lighthouse",
                "--port",
                str(COORDINATOR_PORT),
                "--min-replicas",
                str(math.ceil(self.nodes / 2)),
            ]
        return [
            "python",
            "-m",
            "ddp.recovery.etcd.decider",
            "--world-size",
            str(self.nodes),
            "--heartbeat-timeout",
            f"{self.train.heartbeat_timeout_s:g}",
            "--timeout",
            f"{self.lifetime_s:g}",
        ]

    def torchft_plan(self) -> LivePlan:
        """The same job, fault and replacement under torchft (no comparison runs of its own)."""
        train = self.train.replace(recovery="torchft")
        return dataclasses.replace(
            self, train=train, recovery="torchft", compare=False, torchft=False
        )

    def restart_plan(self) -> KillPlan:
        """The same job on the restart path: checkpoints, the fault, every rank restarted."""
        train = self.train.replace(
            recovery="restart",
            coordinator=None,
            checkpoint_every=self.restart_checkpoint_every,
            checkpoint_dir=checkpoint_dir("fault"),
        )
        return KillPlan(
            rank=self.rank,
            at_step=self.at_step,
            mode=self.mode,
            train=train,
            nodes=self.nodes,
            recover=True,
            run_timeout_s=self.run_timeout_s,
            image=self.image,
            runs_dir=self.runs_dir,
            progress=self.progress,
        )

    def describe(self) -> str:
        t = self.train
        rejoin = ", then a replacement joins" if self.rejoin else ""
        node = (
            "a lighthouse node (torchft)"
            if self.recovery == "torchft"
            else f"a coordinator node, {ETCD_MEMBERS} etcd nodes"
        )
        return (
            f"{self.layout.describe()} and {node}, model {t.model}, {t.steps} steps "
            f"({t.step_delay_ms:g} ms step delay), heartbeat timeout {t.heartbeat_timeout_s:g} "
            f"s; fault: {self.mode} {self.target_text} in step {self.at_step}{rejoin}"
        )
