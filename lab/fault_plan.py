"""What ``python -m lab kill`` will do, as plain validated data and the commands it implies.

Pure (no Docker calls): the plan is checked before any container exists, and the rank commands
and iptables rules it produces are unit tested without an engine. :mod:`lab.faults` executes it.

A run has up to three phases, each in its own directory on the run's shared volume (so nothing
of one phase, rendezvous file, logs or flight dumps, can leak into the next):

- ``reference`` (only with ``--recover``): an uninterrupted run of the same length and settings;
- ``fault``: the run whose rank ``rank`` is killed, paused or cut off during step ``at_step``;
- ``resume`` (only with ``--recover``): every rank restarts from the fault phase's newest
  complete checkpoint, with a fresh rendezvous file.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass

from lab.specs import MOUNT

__all__ = [
    "MODES",
    "PARTITION_CHAIN",
    "PHASES",
    "PHASE_MARK",
    "FaultPlan",
    "partition_commands",
    "phase_dir",
    "rank_command",
    "shell_script",
]

MODES = ("kill", "pause", "partition")
PHASES = ("reference", "fault", "resume")
PHASE_MARK = "LAB_PHASE="  # first line of every phase in a container's log
PARTITION_CHAIN = "LAB_PARTITION"  # the cut rank's DROP rules live in their own chain
_DUMP_GRACE_S = 2.0  # ddp's survivors wait this long for the others' flight dumps


def _int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _number(name: str, value: object, *, positive: bool) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value <= 0 if positive else value < 0):  # type: ignore[operator]
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")


@dataclass(frozen=True)
class FaultPlan:
    """One ``lab kill`` run: which rank, when, how, and the training it interrupts.

    ``at_step`` is the step during which the fault lands: lab injects it as soon as rank
    ``rank`` reports step ``at_step - 1`` done, and ``step_delay_ms`` (a sleep inside every
    step, before backward) leaves that much time for the injection to land before the rank
    reaches the step's first allreduce.
    """

    rank: int
    at_step: int
    mode: str
    timeout_s: float = 30.0  # collective timeout of every rank (ddp's --timeout)
    steps: int = 12
    nodes: int = 4
    checkpoint_every: int = 2
    recover: bool = False
    step_delay_ms: float = 250.0
    model: str = "mini"
    batch_size: int = 64
    seed: int = 0
    startup_s: float = 300.0  # allowance for containers to import torch and rendezvous
    slack_s: float = 90.0  # added to every wait derived from the collective timeout

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        _int("--nodes", self.nodes, 2)  # a fault needs at least one survivor to notice it
        _int("--steps", self.steps, 1)
        _int("--checkpoint-every", self.checkpoint_every, 0)
        _int("--batch-size", self.batch_size, 1)
        _int("--seed", self.seed, 0)
        _int("--rank", self.rank, 0)
        _int("--at-step", self.at_step, 1)
        if self.rank >= self.nodes:
            raise ValueError(
                f"--rank {self.rank} is out of range: {self.nodes} nodes run ranks "
                f"0..{self.nodes - 1} (one rank per node)"
            )
        if self.at_step > self.steps:
            raise ValueError(
                f"--at-step {self.at_step} is beyond the run: it trains {self.steps} steps; "
                f"pick a step in 1..{self.steps} or raise --steps"
            )
        _number("--timeout", self.timeout_s, positive=True)
        _number("--step-delay-ms", self.step_delay_ms, positive=False)
        _number("startup_s", self.startup_s, positive=True)
        _number("slack_s", self.slack_s, positive=False)
        if self.batch_size % self.nodes:
            raise ValueError(
                f"--batch-size {self.batch_size} must divide evenly over {self.nodes} ranks"
            )
        if self.recover and self.checkpoint_every == 0:
            raise ValueError(
                "--recover needs checkpoints to resume from: pass --checkpoint-every K "
                f"with K < --at-step ({self.at_step})"
            )
        if self.recover and self.at_step <= self.checkpoint_every:
            raise ValueError(
                f"--recover: no checkpoint exists before the fault (the first is written "
                f"after step {self.checkpoint_every}, the fault lands in step {self.at_step}); "
                f"use --checkpoint-every < {self.at_step} or a later --at-step"
            )

    @property
    def world_size(self) -> int:
        return self.nodes

    @property
    def survivors(self) -> list[int]:
        """Ranks expected to notice the fault and exit on their own (the cut-off rank of a
        partition is alive and times out like the others)."""
        if self.mode == "partition":
            return list(range(self.world_size))
        return [r for r in range(self.world_size) if r != self.rank]

    @property
    def last_checkpoint_before_fault(self) -> int | None:
        """Newest checkpoint step complete when the fault lands (None without one)."""
        if not self.checkpoint_every:
            return None
        step = (self.at_step - 1) // self.checkpoint_every * self.checkpoint_every
        return step or None

    def notice_deadline_s(self) -> float:
        """How long after the injection the survivors may take to exit with a diagnosis:
        the collective timeout, ddp's grace for the others' dumps, and slack for a busy host."""
        return self.timeout_s + _DUMP_GRACE_S + self.slack_s

    def run_deadline_s(self, steps: int | None = None) -> float:
        """Bound on an undisturbed phase of ``steps`` steps (default: the whole run)."""
        n = self.steps if steps is None else steps
        per_step = self.step_delay_ms / 1e3 + 5.0  # the mini model's step is ~0.1 s; 5 s is slack
        return self.startup_s + n * per_step + self.slack_s

    def lifetime_s(self) -> float:
        """How long the containers' main process (a ``sleep``) lives: longer than every wait
        of every phase, so a lab that died without cleaning up leaves no container running
        forever."""
        phases = self.run_deadline_s() + self.notice_deadline_s() + 60.0
        if self.recover:
            phases += 2 * self.run_deadline_s()
        return math.ceil(phases + 120.0)

    def train_flags(self, phase: str) -> list[str]:
        """``python -m ddp train`` flags for a phase (the rendezvous flags are added per rank)."""
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
        flags = [
            "--steps", str(self.steps),
            "--batch-size", str(self.batch_size),
            "--seed", str(self.seed),
            "--model", self.model,
            "--timeout", f"{self.timeout_s:g}",
            "--step-delay-ms", f"{self.step_delay_ms:g}",
            "--log-all-ranks",
        ]  # fmt: skip
        if self.checkpoint_every:
            # The resumed run keeps checkpointing like the uninterrupted one, and reads the
            # fault phase's checkpoints: same settings, only the starting point differs.
            every = ["--checkpoint-every", str(self.checkpoint_every)]
            own = "fault" if phase == "resume" else phase
            flags += [*every, "--checkpoint-dir", f"{phase_dir(own)}/checkpoints"]
        if phase == "resume":
            flags.append("--resume")
        return flags


def phase_dir(phase: str) -> str:
    """The phase's directory on the shared volume (rendezvous file, logs, flight dumps)."""
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    return f"{MOUNT}/{phase}"


def rank_command(plan: FaultPlan, phase: str, node: int) -> list[str]:
    """What lab execs into ``node`` for ``phase``: the node launcher (:mod:`lab.node`) with its
    output sent to the container's own stdout, so ``docker logs`` (and lab) see every line.

    The container's main process is a ``sleep``; writing to its stdout (``/proc/1/fd/1``) puts
    the exec'd launcher's lines in the container log, where a killed container's last lines
    also survive. The first line, ``LAB_PHASE=<phase>``, tells a reader of the container log
    where this phase's output begins (earlier phases ran in the same container).
    """
    if not 0 <= node < plan.nodes:
        raise ValueError(f"node must be in 0..{plan.nodes - 1}, got {node}")
    base = phase_dir(phase)
    launcher = [
        "python", "-m", "lab.node",
        "--node", str(node),
        "--ranks", str(node),  # one rank per node: rank == node
        "--world-size", str(plan.world_size),
        "--init-method", f"file://{base}/rendezvous",
        "--log-dir", f"{base}/logs",
        "--",
        *plan.train_flags(phase),
    ]  # fmt: skip
    script = (
        f"exec >/proc/1/fd/1 2>&1; echo {PHASE_MARK}{phase}; "
        f"mkdir -p {shlex.quote(base)}/logs && exec {shlex.join(launcher)}"
    )
    return ["sh", "-c", script]


def partition_commands(
    peer_ips: list[str],
) -> tuple[list[list[str]], list[list[str]], list[list[str]]]:
    """iptables argvs that cut one container off from ``peer_ips`` (run inside it, as root).

    Returns ``(prepare, cut, undo)``. ``prepare`` builds a chain that drops every packet to or
    from a peer but is not yet used; ``cut`` hooks it into INPUT and OUTPUT (two fast commands,
    so the partition lands within the step delay); ``undo`` unhooks and deletes it. Stateless
    DROP rules also stop established gloo connections: nothing is rejected, so the peers see
    silence, as with a real partition, not a reset.
    """
    if not peer_ips:
        raise ValueError("a partition needs at least one peer address to cut off")
    ipt = ["iptables", "-w", "5"]
    prepare = [[*ipt, "-N", PARTITION_CHAIN]]
    for ip in peer_ips:
        prepare.append([*ipt, "-A", PARTITION_CHAIN, "-s", ip, "-j", "DROP"])
        prepare.append([*ipt, "-A", PARTITION_CHAIN, "-d", ip, "-j", "DROP"])
    cut = [[*ipt, "-I", chain, "1", "-j", PARTITION_CHAIN] for chain in ("INPUT", "OUTPUT")]
    undo = [[*ipt, "-D", chain, "-j", PARTITION_CHAIN] for chain in ("INPUT", "OUTPUT")]
    undo += [[*ipt, "-F", PARTITION_CHAIN], [*ipt, "-X", PARTITION_CHAIN]]
    return prepare, cut, undo


def shell_script(commands: list[list[str]], *, keep_going: bool = False) -> list[str]:
    """One ``sh -c`` argv running ``commands`` in order (one exec instead of one per command).

    Stops at the first failure, unless ``keep_going`` (for undo: remove whatever exists).
    """
    joiner = " ; " if keep_going else " && "
    return ["sh", "-c", joiner.join(shlex.join(c) for c in commands)]
