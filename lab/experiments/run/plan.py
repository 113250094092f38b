"""``lab run``'s plan: the user's command, where it comes from, the layout, the link, the faults.

Pure and validated before any container exists; every refusal is one line naming the flag
(exit 2): a script that does not exist (or lies outside ``--workdir``, the only directory the
nodes get), a workdir over :data:`MAX_WORKDIR_MB`, a requirements file that is missing, a fault
aimed at a rank or node the layout has not, a step cue without the instrumentation that gives
steps. Whether a requirements file resolves is asked of pip on the host, before the run too
(:mod:`.requirements`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from lab.engine.layout import Layout
from lab.engine.specs import DEFAULT_IMAGE
from lab.experiments.run.faults import FaultCue
from lab.shaping.impair import Impairments

__all__ = [
    "EXCLUDED_DIRS",
    "MAX_WORKDIR_MB",
    "NODE_WORKDIR",
    "RunPlan",
    "script_of",
    "workdir_files",
]

MAX_WORKDIR_MB = 100.0  # copied into every node, through the engine's API, per run
NODE_WORKDIR = "/workdir"  # where the workdir lands in every node, and the script's cwd
# Never copied: version control, caches, environments and the lab's own outputs.
EXCLUDED_DIRS = frozenset(
    {
        ".git",
        "__pycache__",
        ".venv",
        "venv",
        "runs",
        ".pytest_cache",
        ".ruff_cache",
        ".mypy_cache",
        "node_modules",
        "wheelhouse",
        ".tox",
    }
)
_PYTHONS = ("python", "python3")


def script_of(command: tuple[str, ...]) -> str | None:
    """The script a command runs (``python train.py ...`` or ``train.py ...``), None for
    ``python -m module`` and other programs."""
    if not command:
        return None
    if command[0].endswith(".py"):
        return command[0]
    if os.path.basename(command[0]) in _PYTHONS:
        rest = [a for a in command[1:]]
        while rest and rest[0].startswith("-") and rest[0] not in ("-m", "-c"):
            rest = rest[1:]  # python -u train.py
        if rest and rest[0] not in ("-m", "-c"):
            return rest[0]
    return None


def workdir_files(workdir: Path) -> tuple[list[Path], int]:
    """Every file copied into the nodes (regular files, :data:`EXCLUDED_DIRS` left out) and
    their total size in bytes."""
    files, total = [], 0
    for root, dirs, names in os.walk(workdir):
        dirs[:] = sorted(d for d in dirs if d not in EXCLUDED_DIRS and not d.endswith(".egg-info"))
        for name in sorted(names):
            path = Path(root) / name
            if path.is_file() and not path.is_symlink():
                files.append(path)
                total += path.stat().st_size
    return files, total


@dataclass(frozen=True)
class RunPlan:
    """One ``lab run``: ``command`` (after ``--``) under torchrun on ``nodes`` x
    ``ranks_per_node`` workers, from ``workdir``; ``ms``/``rate_mbit``/``impair`` the link
    between the nodes (0 and None: unshaped); ``faults`` on cue; ``hang_after_s`` None: a few
    median steps (:mod:`.hang`)."""

    command: tuple[str, ...]
    workdir: Path = field(default_factory=Path.cwd)
    nodes: int = 2
    ranks_per_node: int = 1
    ms: float = 0.0
    rate_mbit: float | None = None
    impair: Impairments = field(default_factory=Impairments)
    shaper: str = "auto"
    faults: tuple[FaultCue, ...] = ()
    hang_after_s: float | None = None
    requirements: Path | None = None
    instrument: bool = True
    run_timeout_s: float = 600.0
    collective_timeout_s: float = 30.0
    image: str = DEFAULT_IMAGE
    runs_dir: Path = Path("runs")
    progress: bool = True
    max_workdir_mb: float = MAX_WORKDIR_MB

    def __post_init__(self) -> None:
        if not self.command:
            raise ValueError(
                "no command: put it after --, e.g. python -m lab run --nodes 2 -- python train.py"
            )
        self.layout  # noqa: B018 - validates --nodes, --ranks-per-node
        if not self.workdir.is_dir():
            raise ValueError(f"--workdir {self.workdir} is not a directory")
        object.__setattr__(self, "workdir", self.workdir.resolve())
        script = script_of(self.command)
        if script is not None:
            path = (self.workdir / script).resolve()
            if not path.is_file():
                raise ValueError(
                    f"no script {script} in --workdir {self.workdir}: the nodes run the command "
                    "there; pass the workdir that holds it"
                )
            if not path.is_relative_to(self.workdir):
                raise ValueError(
                    f"script {script} lies outside --workdir {self.workdir}, and only the "
                    "workdir is copied into the nodes; pass --workdir of a folder that holds it"
                )
        _, size = workdir_files(self.workdir)
        if size > self.max_workdir_mb * 1e6:
            raise ValueError(
                f"--workdir {self.workdir} holds {size / 1e6:.0f} MB, over the "
                f"{self.max_workdir_mb:g} MB limit (copied into every node): pass "
                "--workdir of the script's own folder, or keep data out of it"
            )
        if self.requirements is not None and not self.requirements.is_file():
            raise ValueError(f"--requirements {self.requirements}: no such file")
        for flag, value in (("--ms", self.ms), ("--run-timeout", self.run_timeout_s)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{flag} must be a finite number >= 0, got {value!r}")
        if self.rate_mbit is not None and not self.rate_mbit > 0:
            raise ValueError(f"--rate-mbit must be > 0, got {self.rate_mbit!r}")
        if self.hang_after_s is not None and not self.hang_after_s > 0:
            raise ValueError(f"--hang-after must be > 0 seconds, got {self.hang_after_s!r}")
        if self.shaped and self.nodes < 2:
            raise ValueError("a shaped link needs --nodes 2 or more: it is the link between nodes")
        for cue in self.faults:
            self._check_fault(cue)

    def _check_fault(self, cue: FaultCue) -> None:
        world = self.layout.world_size
        if cue.rank is not None and not cue.rank < world:
            raise ValueError(
                f"--fault {cue.text}: rank {cue.rank} is out of range, the ranks are 0..{world - 1}"
            )
        if cue.node is not None and not cue.node < self.nodes:
            raise ValueError(
                f"--fault {cue.text}: node {cue.node} is out of range, the nodes are "
                f"0..{self.nodes - 1}"
            )
        if cue.by_step and not self.instrument:
            raise ValueError(
                f"--fault {cue.text}: at-step needs the step records, which --no-instrument "
                "turns off; cue it at=SECONDS instead"
            )
        if cue.kind == "partition" and self.nodes < 2:
            raise ValueError(f"--fault {cue.text}: a partition needs --nodes 2 or more")
        if cue.kind == "link" and self.nodes < 2:
            raise ValueError(f"--fault {cue.text}: the link is between nodes: --nodes 2 or more")

    @property
    def layout(self) -> Layout:
        return Layout(self.nodes, self.ranks_per_node)

    @property
    def shaped(self) -> bool:
        return bool(self.ms or self.rate_mbit or self.impair)

    @property
    def net_admin(self) -> bool:
        """Shaping and partitions change the nodes' network: CAP_NET_ADMIN."""
        return self.shaped or any(c.kind in ("partition", "link") for c in self.faults)

    @property
    def argv(self) -> list[str]:
        """What torchrun runs in every worker (``--no-python``): ``train.py`` alone runs
        under python."""
        cmd = list(self.command)
        return ["python", *cmd] if cmd[0].endswith(".py") else cmd

    @property
    def lifetime_s(self) -> float:
        """The containers' main process outlives the job, the link checks and the diagnosis."""
        return math.ceil(self.run_timeout_s + 300.0)

    def link_text(self, ms: float | None = None) -> str:
        """``5 ms between nodes``, ``an unshaped link``."""
        ms = self.ms if ms is None else ms
        if not (ms or self.rate_mbit or self.impair):
            return "unshaped link" if self.nodes > 1 else "one node"
        rate = f", {self.rate_mbit:g} Mbit/s" if self.rate_mbit else ""
        impair = f", {self.impair.describe()}" if self.impair else ""
        return f"{ms:g} ms between nodes{rate}{impair}"

    def describe(self) -> str:
        world = self.layout.world_size
        faults = "; faults: " + ", ".join(c.describe() for c in self.faults) if self.faults else ""
        return (
            f"{world} ranks on {self.nodes} nodes, {self.link_text()}; `{' '.join(self.command)}` "
            f"from {self.workdir}{faults}"
        )
